"""TEST DOUBLE of flashinfer (flashinfer-python): its version, and the directory its prebuilt
(AOT) modules are loaded from, decided at import as flashinfer/jit/env.py decides it
(flashinfer-ai/flashinfer v0.6.12 env.py:27-36 and :100-132): an installed flashinfer_jit_cache
whose version does not start with flashinfer's raises RuntimeError (unless
FLASHINFER_DISABLE_VERSION_CHECK), so `import flashinfer` fails as the real one does; else its
get_jit_cache_dir(); without one, the package's own data/aot (none here).
"""

import importlib.util
import os
import pathlib

from flashinfer._double_build import VERSION

__version__ = VERSION


def _get_aot_dir() -> pathlib.Path:
    if importlib.util.find_spec("flashinfer_jit_cache") is not None:
        import flashinfer_jit_cache

        found = flashinfer_jit_cache.__version__
        if not os.getenv("FLASHINFER_DISABLE_VERSION_CHECK") and not found.startswith(VERSION):
            raise RuntimeError(
                f"flashinfer-jit-cache version ({found}) does not match flashinfer version "
                f"({VERSION}). Please install the same version of both packages."
            )
        return pathlib.Path(flashinfer_jit_cache.get_jit_cache_dir())
    return pathlib.Path(__file__).parent / "data" / "aot"


FLASHINFER_AOT_DIR = _get_aot_dir()
