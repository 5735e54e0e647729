"""TEST DOUBLE of flashinfer-jit-cache (FlashInfer's prebuilt JIT modules, one wheel per CUDA
lane): its version, `<FlashInfer's version>+<lane>`, and where its modules are, as the real
package says (flashinfer-ai/flashinfer v0.6.12 flashinfer-jit-cache/flashinfer_jit_cache/
__init__.py:22-27: jit_cache_dir is the package's jit_cache/ folder, get_jit_cache_dir() returns
it). The wheel holds jit_cache/<name>/<name>.so for each module the rank-start double builds
(tests/doubles/wheels.py jit_cache_wheel): files that say they are doubles, loaded by nothing.
"""

from pathlib import Path

from flashinfer_jit_cache._double_build import VERSION

__version__ = VERSION
jit_cache_dir = Path(__file__).parent / "jit_cache"


def get_jit_cache_dir() -> str:
    return str(jit_cache_dir)
