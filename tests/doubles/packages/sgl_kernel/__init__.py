"""TEST DOUBLE of the SGLang kernel package (sgl-kernel / sglang-kernel): its version, and the
one way a build of the wrong CUDA major fails on import. The real wheels link the CUDA runtime
of their build (PyPI's sglang-kernel 0.4.2 links libcudart.so.13, see
../shared/reference/package-indexes.md) and find it beside torch, whose CUDA build ships only
its own major's libcudart: the loader then fails with the message in
tests/fixtures/cuda-errors/libcudart-13-missing.txt. A CUDA 12.9 build beside a 12.8 torch
loads (same libcudart.so.12)."""

import torch

from sgl_kernel._double_build import CUDA, VERSION

__version__ = VERSION

_major = CUDA.split(".")[0]
if torch.version.cuda and torch.version.cuda.split(".")[0] != _major:
    raise ImportError(
        f"libcudart.so.{_major}: cannot open shared object file: No such file or directory"
    )
