"""`python -m operations.releases`: the command lives in operations/cli/releases.py."""

import sys

from operations.cli.closed_pipe import quiet
from operations.cli.releases import main

if __name__ == "__main__":
    sys.exit(quiet(main))
