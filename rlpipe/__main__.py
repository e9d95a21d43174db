"""`python -m rlpipe ...`: the same as the `rlpipe` console script."""

from rlpipe.cli.main import main

main()
