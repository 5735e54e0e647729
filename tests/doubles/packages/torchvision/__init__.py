"""TEST DOUBLE of torchvision: refuses to load beside a torch of another CUDA major, with real
torchvision's message (torchvision/extension.py `_check_cuda_version`; the text is in
tests/fixtures/cuda-errors/torchvision-cuda-mismatch.txt)."""

import torch

from torchvision._double_build import CUDA, VERSION

__version__ = VERSION

if torch.version.cuda and CUDA and torch.version.cuda.split(".")[0] != CUDA.split(".")[0]:
    raise RuntimeError(
        "Detected that PyTorch and torchvision were compiled with different CUDA major "
        f"versions. PyTorch has CUDA Version={torch.version.cuda} and torchvision has CUDA "
        f"Version={CUDA}. Please reinstall the torchvision that matches your PyTorch install."
    )
