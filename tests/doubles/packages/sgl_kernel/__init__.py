"""TEST DOUBLE of the SGLang kernel package (sgl-kernel / sglang-kernel): only its version."""

from sgl_kernel._double_build import VERSION

__version__ = VERSION
