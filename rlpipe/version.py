"""The package version, written in this one place (pyproject.toml, ``rlpipe --version`` and
every dataset's ``metadata.json`` read it from here)."""

__version__ = "0.1.0"
