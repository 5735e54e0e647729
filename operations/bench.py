"""`python -m operations.bench`: the command lives in operations/cli/bench.py."""

import sys

from operations.cli.bench import main
from operations.cli.closed_pipe import quiet

if __name__ == "__main__":
    sys.exit(quiet(main))
