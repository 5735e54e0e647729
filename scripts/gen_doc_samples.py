"""Regenerate the docs' samples (docs/samples/) from the simulated hosts, as the programs print
them: nothing is contacted (pyinfra's @fake connector, operations/simulated/).

    .venv/bin/python scripts/gen_doc_samples.py          # write docs/samples/*.txt
    .venv/bin/python scripts/gen_doc_samples.py --check  # exit 1 naming each sample that differs

Each sample is one program's output at 80 columns (a log's width): the plan box of a first
deploy (`operations.plan inventory/demo.py`) and `status` of a converged host
(`operations.status inventory/demo_day2.py`). A doc shows a sample between
`<!-- sample: NAME -->` and `<!-- /sample -->`; this script rewrites those blocks too, and
tests/unit/test_doc_samples.py fails when a sample or a doc's copy differs from the program's
output. The throughput line and the canary's verdict table get their samples from the
simulated host once it records them (SAMPLES below marks their places).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_DIR = ROOT / "docs" / "samples"
WIDTH = 80
BLOCK = re.compile(r"(<!-- sample: ([\w-]+) -->\n```text\n)(.*?)(```\n<!-- /sample -->)", re.S)


@dataclass(frozen=True)
class Sample:
    name: str
    argv: tuple[str, ...]  # after the venv's python
    # Or a line the real program printed, captured (operations/simulated/captured/ct200): a
    # check that runs minutes against server doubles is not run again here; its test
    # (tests/unit/test_doc_samples.py) derives it again from the captured records.
    captured: str = ""


CAPTURED = ROOT / "operations" / "simulated" / "captured" / "ct200"
SAMPLES = (
    Sample("plan-box", ("-m", "operations.plan", "inventory/demo.py")),
    Sample("status", ("-m", "operations.status", "inventory/demo_day2.py")),
    # status after a throughput check and a failed canary: both records, the verdict's rows.
    Sample("status-measured", ("-m", "operations.status", "inventory/demo_measured.py")),
    # The deploy's throughput line (the second of the captured checks), and the verdict table
    # of the failed canary status-measured shows.
    Sample("throughput-line", (), "throughput-line.txt"),
    Sample("verdict-table", (), "verdict-table.txt"),
)


def produce(sample: Sample) -> str:
    """What the program prints on the simulated host, at WIDTH columns, no colour."""
    if sample.captured:
        return (CAPTURED / sample.captured).read_text()
    env = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run(
        [sys.executable, *sample.argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    if "Traceback" in out:
        raise SystemExit(f"gen_doc_samples: {sample.name}: the program failed:\n{out}")
    return "\n".join(line.rstrip() for line in out.splitlines()) + "\n"


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def with_samples(text: str, samples: dict[str, str]) -> str:
    """A doc's text with each sample block holding the sample's current text."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in samples:
            return match.group(0)
        return match.group(1) + samples[name] + match.group(4)

    return BLOCK.sub(fill, text)


def differences(samples: dict[str, str]) -> list[str]:
    found = []
    for name, text in samples.items():
        path = SAMPLES_DIR / f"{name}.txt"
        if not path.exists() or path.read_text() != text:
            found.append(f"{path.relative_to(ROOT)} differs from the program's output")
    for doc in docs():
        text = doc.read_text()
        for match in BLOCK.finditer(text):
            if match.group(2) not in samples:
                found.append(f"{doc.relative_to(ROOT)}: no sample named {match.group(2)!r}")
        if with_samples(text, samples) != text:
            found.append(f"{doc.relative_to(ROOT)}: a sample differs from the program's output")
    return found


def main(argv: list[str]) -> int:
    samples = {s.name: produce(s) for s in SAMPLES}
    if argv == ["--check"]:
        found = differences(samples)
        for line in found:
            print(f"gen_doc_samples: {line} (make samples)", file=sys.stderr)
        return 1 if found else 0
    if argv:
        print("usage: scripts/gen_doc_samples.py [--check]", file=sys.stderr)
        return 2
    SAMPLES_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in samples.items():
        (SAMPLES_DIR / f"{name}.txt").write_text(text)
    for doc in docs():
        text = doc.read_text()
        if (new := with_samples(text, samples)) != text:
            doc.write_text(new)
    print(f"gen_doc_samples: {len(samples)} sample(s) in {SAMPLES_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
