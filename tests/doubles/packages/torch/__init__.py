"""TEST DOUBLE of torch: reports the version and CUDA build it was built as, nothing else.

tests/doubles/wheels.py writes torch/_double_build.py with the values of one build (for example
2.11.0+cu128, CUDA 12.8, its compiled architectures).
"""

from torch import cuda, version
from torch._double_build import VERSION

__version__ = VERSION
__all__ = ["__version__", "cuda", "version"]
