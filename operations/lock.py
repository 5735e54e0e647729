"""`python -m operations.lock`: an engine's uv lock made on the controller, with no host; the
command lives in operations/cli/engine_lock.py."""

import sys

from operations.cli.closed_pipe import quiet
from operations.cli.engine_lock import main

if __name__ == "__main__":
    sys.exit(quiet(main))
