"""`python -m operations.status`."""

import sys

from operations.status.cli import main

sys.exit(main())
