"""`python -m operations.kb`: the command lives in operations/cli/kb.py."""

import sys

from operations.cli.kb import main

sys.exit(main())
