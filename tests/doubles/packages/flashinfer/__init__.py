"""TEST DOUBLE of flashinfer (flashinfer-python): only its version."""

from flashinfer._double_build import VERSION

__version__ = VERSION
