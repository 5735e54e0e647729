"""What the host's NVIDIA driver reports: one nvidia-smi round trip for all GPUs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyinfra.api.facts import FactBase

QUERY_FIELDS = ("index", "name", "compute_cap", "memory.total", "driver_version", "uuid")
RC_MARKER = "@@nvidia-smi-rc="
_CUDA_RE = re.compile(r"CUDA Version:\s*([0-9.]+|N/A|Not Found)")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str
    memory_total_mib: int
    uuid: str


@dataclass(frozen=True)
class NvidiaSmi:
    """`ok` False means nvidia-smi did not answer; `error` then holds what it printed."""

    ok: bool
    error: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    # The highest CUDA version the driver supports, from the banner; None when it says N/A.
    cuda_version: str | None = None


def parse_nvidia_smi(lines: list[str]) -> NvidiaSmi:
    rc = None
    csv_lines: list[str] = []
    banner: list[str] = []
    for line in lines:
        if line.startswith(RC_MARKER):
            rc = int(line[len(RC_MARKER) :].strip() or "1")
        elif rc is None:
            csv_lines.append(line)
        else:
            banner.append(line)

    if rc != 0:
        text = " ".join(s.strip() for s in csv_lines if s.strip()) or f"exit status {rc}"
        return NvidiaSmi(ok=False, error=text)

    gpus: list[Gpu] = []
    drivers: set[str] = set()
    for line in csv_lines:
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS) or not cells[0].isdigit():
            return NvidiaSmi(ok=False, error=f"unexpected nvidia-smi output: {line.strip()!r}")
        index, name, cap, memory, driver, uuid = cells
        gpus.append(
            Gpu(
                index=int(index),
                name=name,
                compute_cap=cap,
                memory_total_mib=int(memory) if memory.isdigit() else 0,
                uuid=uuid,
            )
        )
        drivers.add(driver)

    cuda = None
    for line in banner:
        match = _CUDA_RE.search(line)
        if match:
            cuda = match.group(1) if match.group(1)[0].isdigit() else None
            break

    return NvidiaSmi(
        ok=True,
        gpus=gpus,
        # One driver serves every GPU; more than one would be a broken host, shown as such.
        driver_version=", ".join(sorted(drivers)) or None,
        cuda_version=cuda,
    )


class NvidiaGpus(FactBase[NvidiaSmi]):
    """
    Returns the GPUs, the driver version and the CUDA version the driver supports, or what
    nvidia-smi said when it could not answer (``ok`` False).

    .. code:: python

        NvidiaSmi(ok=True, gpus=[Gpu(index=0, name="NVIDIA RTX PRO 6000 Blackwell ...",
                  compute_cap="12.0", memory_total_mib=97887, uuid="GPU-...")],
                  driver_version="570.172.08", cuda_version="12.8")
    """

    # Both queries in one round trip; the exit status travels as a marker line so that a
    # failing nvidia-smi is a fact to report, not a failed fact gathering.
    def command(self) -> str:
        fields = ",".join(QUERY_FIELDS)
        return (
            f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits 2>&1; "
            f'echo "{RC_MARKER}$?"; '
            "nvidia-smi 2>/dev/null | grep -m1 'CUDA Version' || true"
        )

    @staticmethod
    def default() -> NvidiaSmi:
        return NvidiaSmi(ok=False, error="nvidia-smi printed nothing")

    def process(self, output: list[str]) -> NvidiaSmi:
        return parse_nvidia_smi(output)
