"""What preflight reads of a host, in one round trip: the GPUs (NvidiaGpus), the container's
resources (HostResources), who can open the GPU nodes (GpuNodeAccess) and, for a source on the
target, the model directory (ModelSource).

Each part is the other fact's own command, run in a subshell at the same time as the others,
printed after a section line once all have ended, and parsed by that fact's own `process` (or
its `default` when the part printed nothing), so the plan reads exactly what the facts would,
for one SSH round trip instead of four, as long as its slowest part takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra.api.command import StringCommand
from pyinfra.api.facts import FactBase

from operations.facts.gpu import GpuAccess, GpuNodeAccess, NvidiaGpus, NvidiaSmi
from operations.facts.host import HostResources, Model, ModelSource, Resources

SECTION = "@@preflight "


@dataclass(frozen=True)
class HostFacts:
    gpu: NvidiaSmi
    resources: Resources
    # The model directory on the target; None when it was not asked (a controller source).
    model: Model | None = None
    # Who can open the GPU nodes (GpuNodeAccess); None when it was not asked.
    access: GpuAccess | None = None


def _part(fact: type[FactBase[Any]], lines: list[str] | None) -> Any:
    if lines is None:
        return None
    instance = fact()
    if not lines:
        default = getattr(instance, "default", None)
        return default() if default is not None else None
    return instance.process(lines)


def parse_host_facts(lines: list[str]) -> HostFacts:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(SECTION):
            current = sections.setdefault(line[len(SECTION) :].strip(), [])
        elif current is not None:
            current.append(line)
    gpu = _part(NvidiaGpus, sections.get("gpu", []))
    resources = _part(HostResources, sections.get("resources", []))
    model = _part(ModelSource, sections.get("model"))
    access = _part(GpuNodeAccess, sections.get("access"))
    return HostFacts(gpu=gpu, resources=resources, model=model, access=access)


class PreflightFacts(FactBase[HostFacts]):
    """
    Returns the GPUs, the host's resources and (with `model_path`) the model directory, as the
    NvidiaGpus, HostResources and ModelSource facts read them, in one round trip.

    .. code:: python

        HostFacts(gpu=NvidiaSmi(ok=True, gpus=[...], driver_version="570.172.08",
                                cuda_version="12.8"),
                  resources=Resources(stage_total_bytes=..., device_nodes=[...], ...),
                  model=Model(exists=True, size_bytes=..., architecture="Qwen3ForCausalLM"))

    + stage_dir, engine_root, roots: as HostResources
    + model_path: the model directory on the target (ModelSource), None to skip it
    + access: (service user, nodes, a rank's sandbox properties) for GpuNodeAccess; None skips it
    """

    def command(
        self,
        stage_dir: str,
        engine_root: str,
        roots: Sequence[str] = (),
        model_path: str | None = None,
        access: tuple[str, Sequence[str], Sequence[tuple[str, str]]] | None = None,
    ) -> StringCommand:
        # (section, part file, command): each part runs at the same time as the others, its
        # output kept in a file of its own in a fresh private directory (mktemp -d: 0700,
        # made by this command) and printed, once all have ended, in this order after its
        # section's line: the two nvidia-smi calls and the GPU probe each wait on the driver,
        # the rest on the disk, and the command takes as long as the slowest part rather than
        # their sum (bench/serve_bench.py). A host where no such directory can be made (a full
        # or read-only /tmp) gets the same parts one after the other, as before.
        parts: list[tuple[str, str, str | StringCommand]] = [
            ("gpu", "gpu", NvidiaGpus.query_command()),
            ("", "gpu-banner", NvidiaGpus.banner_command()),
            (
                "resources",
                "resources",
                HostResources().command(stage_dir=stage_dir, engine_root=engine_root, roots=roots),
            ),
        ]
        if access is not None:
            user, nodes, properties = access
            probe = GpuNodeAccess().command(user, list(nodes), list(properties))
            parts.append(("access", "access", probe))
        # Last: config.json is printed as it is, maybe without a final newline.
        if model_path is not None:
            parts.append(("model", "model", ModelSource().command(path=model_path)))
        pieces: list[str | StringCommand] = []
        for number, (_, _, part) in enumerate(parts):
            pieces += [f"_part{number}() {{ (", part, "); };"]
        pieces.append("if d=$(mktemp -d 2>/dev/null); then trap 'rm -rf \"$d\"' EXIT;")
        for number, (_, name, _) in enumerate(parts):
            pieces.append(f'_part{number} > "$d/{name}" &')
        pieces.append("wait;")
        for section, name, _ in parts:
            if section:
                pieces.append(f"echo '{SECTION}{section}';")
            pieces.append(f'cat "$d/{name}";')
        pieces.append("else")
        for number, (section, _, _) in enumerate(parts):
            if section:
                pieces.append(f"echo '{SECTION}{section}';")
            pieces.append(f"_part{number};")
        pieces.append("fi; true")
        return StringCommand(*pieces)

    @staticmethod
    def default() -> HostFacts:
        return parse_host_facts([])

    def process(self, output: list[str]) -> HostFacts:
        return parse_host_facts(output)
