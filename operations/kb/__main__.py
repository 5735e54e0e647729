"""`python -m operations.kb`: the command lives in operations/cli/kb.py."""

import sys

from operations.cli.closed_pipe import quiet
from operations.cli.kb import main

sys.exit(quiet(main))
