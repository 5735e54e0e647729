"""TEST DOUBLE of torch.version: the CUDA toolkit this torch build claims."""

from torch._double_build import CUDA, VERSION

__version__ = VERSION
cuda = CUDA
