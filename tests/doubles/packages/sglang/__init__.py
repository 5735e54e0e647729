"""TEST DOUBLE of the sglang package (tests/doubles/wheels.py builds it into a wheel).

Only what a deploy touches: the version, and `python -m sglang.launch_server` with the pinned
release's real option table. No model is loaded and no GPU is used.
"""

from sglang._double_build import VERSION

__version__ = VERSION
