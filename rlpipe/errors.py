"""The one exception type the CLI turns into a single line and exit code 2."""


class RlpipeError(Exception):
    """A problem with the user's input or stored data, reported as one line (exit code 2)."""
