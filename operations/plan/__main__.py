"""`python -m operations.plan`: the command lives in operations/cli/plan.py."""

import sys

from operations.cli.closed_pipe import quiet
from operations.cli.plan import main

sys.exit(quiet(main))
