"""The throughput check's records on a host (layout.THROUGHPUT_RECORDS, one JSON line per run,
programs/throughput.py writes them): `status` reads the last RECORDS_READ, oldest first, in its
one round trip (facts/serve_status.py ServingStatus, `throughput=True`)."""

from __future__ import annotations

import json
from typing import cast

from operations.programs.throughput_guard import Record

# Enough to find the record before the last one of the same workload after a few other ones.
RECORDS_READ = 50


def parse_records(lines: list[str]) -> list[Record]:
    """Each line that is a JSON object, in order; a line cut by a crash is left out."""
    records: list[Record] = []
    for line in lines:
        try:
            read = json.loads(line)
        except ValueError:
            continue
        if isinstance(read, dict):
            records.append(cast(Record, read))
    return records
