#!/usr/bin/env python3
"""The ModelSource fact's script (operations/facts/host.py), sent as one `python3 -c` argument:
whether a model directory exists, the bytes the staging copy takes from it, and its config.json,
all read by the staging copy's own link rule (stage_manifest.py), so a Hugging Face cache
snapshot is read as it is staged and a link that leaves the source is never followed.

Usage: python3 stage_source.py SOURCE   (lines: "exists", bytes, @@config.json, the config)
"""

from __future__ import annotations

import sys

from operations.programs.stage_manifest import describe


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: stage_source.py SOURCE", file=sys.stderr)
        return 2
    print("\n".join(describe(argv[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
