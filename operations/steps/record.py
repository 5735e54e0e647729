"""Step 7 of the deploy: the toolkit version that deployed the host, recorded on it.

The last operation of a host's run: pyinfra runs none of a host's operations after one that
failed, so the record (layout.TOOLKIT_RECORD) names a version only once every step before it
succeeded. The plan decides its content (operations/plan/toolkit_version.py): this version, and
the date it was first recorded, kept while the version is unchanged, so a converged run writes
nothing.
"""

from __future__ import annotations

from operations.plan.host_plan import HostReport
from operations.steps.host_files import put_planned


def record_version(report: HostReport) -> None:
    if report.toolkit is not None:
        put_planned(report.toolkit.file)
