"""The one exception type the CLI turns into a single line and exit code 2 (and its kind for outputs)."""


class RlpipeError(Exception):
    """A problem with the user's input or stored data, reported as one line (exit code 2)."""


class OutputError(RlpipeError, OSError):
    """A file output that cannot be written where the user named it (a directory, a socket, a
    parent that is missing or read-only, a /proc entry): one line and exit code 2 in the CLI,
    and still an OSError for library callers that treat a failed write as one."""


class ArgumentError(RlpipeError, ValueError):
    """A Python API argument out of its range: a ValueError to library callers, one line in the CLI."""


class ArgumentTypeError(RlpipeError, TypeError):
    """A Python API argument of the wrong type: a TypeError to library callers, one line in the CLI."""
