"""`python -m operations.tune`: the command lives in operations/cli/tune.py."""

import sys

from operations.cli.closed_pipe import quiet
from operations.cli.tune import main

if __name__ == "__main__":
    sys.exit(quiet(main))
