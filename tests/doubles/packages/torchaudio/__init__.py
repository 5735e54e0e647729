"""TEST DOUBLE of torchaudio: refuses to load beside a torch of another CUDA version (major and
minor), with real torchaudio's message (torchaudio/_extension/utils.py `_check_cuda_version`;
captured text in tests/fixtures/cuda-errors/torchaudio-cuda-mismatch.txt)."""

import torch

from torchaudio._double_build import CUDA, VERSION

__version__ = VERSION

if torch.version.cuda and CUDA and torch.version.cuda != CUDA:
    raise RuntimeError(
        "Detected that PyTorch and TorchAudio were compiled with different CUDA versions. "
        f"PyTorch has CUDA version {torch.version.cuda} whereas TorchAudio has CUDA version "
        f"{CUDA}. Please install the TorchAudio version that matches your PyTorch version."
    )
