"""TEST DOUBLE of torch: the version and CUDA build it was built as, torch.cuda as it behaves
with the host's driver, and the one tensor operation the engine check runs (ones, *, sum,
item) on a CUDA device.

tests/doubles/wheels.py writes torch/_double_build.py with the values of one build (for example
2.11.0+cu128, CUDA 12.8, its compiled architectures).
"""

from __future__ import annotations

from torch import cuda, version
from torch._double_build import VERSION

__version__ = VERSION
__all__ = ["Tensor", "__version__", "cuda", "ones", "version"]


class Tensor:
    def __init__(self, values: list[float], device: str) -> None:
        self.values = values
        self.device = device

    def __mul__(self, other: float) -> Tensor:
        return Tensor([v * other for v in self.values], self.device)

    def sum(self) -> Tensor:
        return Tensor([sum(self.values)], self.device)

    def item(self) -> float:
        return self.values[0]


def ones(size: int, device: str = "cpu") -> Tensor:
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        # Raises as real torch does when the device cannot run CUDA.
        cuda.synchronize(index)
    return Tensor([1.0] * size, device)
