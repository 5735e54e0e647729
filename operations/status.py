"""`python -m operations.status`: the command lives in operations/cli/status/."""

import sys

from operations.cli.closed_pipe import quiet
from operations.cli.status.cli import main

if __name__ == "__main__":
    sys.exit(quiet(main))
