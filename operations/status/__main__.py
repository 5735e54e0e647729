"""`python -m operations.status`."""

import sys

from operations.closed_pipe import quiet
from operations.status.cli import main

sys.exit(quiet(main))
