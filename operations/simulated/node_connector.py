"""pyinfra's @fake connector under the name the inventory gives the host: `@simulated/pve1/ct200`
is the host `pve1/ct200`, answering from its `fake_responses` as @fake does, where @fake would
name it `@fake/pve1/ct200`. inventory/pve_demo.py names its host for what it simulates, the
Proxmox node pve1 seen for its container ct200, so pyinfra's lines and pve.py's say
"pve1/ct200".

pyinfra finds connectors by their entry point (group `pyinfra.connectors`, pyinfra/api/
connectors.py). This one is declared in the metadata folder beside this module
(connector/sglang_toolkit_simulated-1.dist-info/entry_points.txt), which the demo inventory
puts on sys.path (`on_path`) before pyinfra makes its hosts: the toolkit is not installed as a
package, so it has no entry point of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from pyinfra.connectors.fake import FakeConnector
from typing_extensions import override

METADATA = Path(__file__).resolve().parent / "connector"
NAME = "simulated"


class SimulatedConnector(FakeConnector):
    """@fake's answers (`fake_responses`, `fake_delay`), the host named as given."""

    @override
    @staticmethod
    def make_names_data(
        name: str | None = None,
    ) -> Iterator[tuple[str, dict[str, object], list[str]]]:
        for sub_name in (name or NAME).split(","):
            if sub_name.strip():
                yield sub_name.strip(), {}, [f"@{NAME}"]


def on_path() -> None:
    """Make the connector's entry point findable (its metadata folder on sys.path)."""
    if str(METADATA) not in sys.path:
        sys.path.append(str(METADATA))
