#!/usr/bin/env python3
"""Generate the knowledge of SGLang's own benchmark client in one release, read from its wheel.

Usage::

    python scripts/gen_bench_client.py 0.5.11 [0.5.23 ...]   # write
    python scripts/gen_bench_client.py --all                   # every release of sglang.yaml
    python scripts/gen_bench_client.py --check --all           # no diff, or exit 1

For each release it writes ``operations/kb/knowledge/bench/sglang-<v>.json``: the module the
throughput check runs (``python -m MODULE``), the file that implements it in the wheel, and the
line (in that file) of every flag the check passes, of the choices it picks, of every field of
the ``--output-file`` JSON line it reads, and of the API key variables the client reads. Nothing
is imported: the files are read as text, so no torch and no GPU. The wheel comes from PyPI with
``pip download --no-deps`` (gen_cli_table.unpacked_release: the same cache, the same wheel).

Up to 0.5.14 ``sglang/bench_serving.py`` is the implementation; from 0.5.15 it is a deprecated
stub (``from sglang.benchmark.serving import cli_main``) and ``sglang/benchmark/serving.py`` is.
The stub is recognised by that import and recorded beside the module.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from scripts.gen_cli_table import default_cache_dir, unpacked_release  # noqa: E402

KNOWLEDGE = REPO_ROOT / "operations" / "kb" / "knowledge"
OUT_DIR = KNOWLEDGE / "bench"

STUB = "sglang/bench_serving.py"
MOVED = "sglang/benchmark/serving.py"
FORWARD = "from sglang.benchmark.serving import cli_main"
# What operations/programs/throughput.py passes (operations/plan/throughput_plan.py CLIENT_FLAGS).
FLAGS = (
    "--backend",
    "--base-url",
    "--model",
    "--tokenizer",
    "--dataset-name",
    "--random-input-len",
    "--random-output-len",
    "--random-range-ratio",
    "--num-prompts",
    "--max-concurrency",
    "--output-file",
    "--disable-tqdm",
    "--seed",
    "--extra-request-body",
)
# (flag, choice, text, near): the values the check picks. --backend's choices are the keys of
# ASYNC_REQUEST_FUNCS (`"sglang-oai": async_request_openai_completions`, anywhere in the file);
# --dataset-name's are listed within its add_argument (near the flag).
CHOICES = (
    ("--backend", "sglang-oai", '"sglang-oai": async_request_openai_completions', False),
    ("--dataset-name", "random-ids", '"random-ids"', True),
)
# The --output-file line's fields the check reads (programs/throughput.py RESULT_FIELDS).
FIELDS = (
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "output_throughput",
    "total_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
)
AUTH_ENV = ("OPENAI_API_KEY", "API_KEY")
AUTH_FILES = (MOVED, "sglang/benchmark/utils.py", "sglang/bench_serving.py")


def _line_of(
    lines: list[str], pattern: str, start: int = 0, window: int | None = None
) -> int | None:
    stop = len(lines) if window is None else min(len(lines), start + window)
    for index in range(start, stop):
        if pattern in lines[index]:
            return index + 1
    return None


def _flag_line(lines: list[str], flag: str) -> int | None:
    """The line of `flag` as an add_argument's option string (on its own line or inline)."""
    quoted = re.compile(r"""^\s*(?:\w+\.add_argument\()?["']""" + re.escape(flag) + r"""["'][,)]""")
    for index, line in enumerate(lines):
        if quoted.search(line):
            return index + 1
    return None


def read_release(src: Path, release: str, wheel: str) -> dict[str, Any]:
    stub_text = (src / STUB).read_text(encoding="utf-8")
    stubbed = FORWARD in stub_text
    impl = MOVED if stubbed else STUB
    lines = (src / impl).read_text(encoding="utf-8").splitlines()
    flags = {flag: _flag_line(lines, flag) for flag in FLAGS}
    choices: dict[str, int | None] = {}
    for flag, choice, text, near in CHOICES:
        at = flags[flag]
        if near:
            choices[f"{flag} {choice}"] = _line_of(lines, text, at, 60) if at else None
        else:
            choices[f"{flag} {choice}"] = _line_of(lines, text)
    result_at = next(
        (i for i, line in enumerate(lines) if '"output_throughput": metrics.' in line), None
    )
    block = 0 if result_at is None else max(0, result_at - 60)
    fields = {name: _line_of(lines, f'"{name}":', block, 120) for name in FIELDS}
    auth: dict[str, str | None] = {}
    for env in AUTH_ENV:
        auth[env] = None
        for name in AUTH_FILES:
            path = src / name
            if not path.exists():
                continue
            at = _line_of(path.read_text(encoding="utf-8").splitlines(), f'"{env}"')
            if at is not None:
                auth[env] = f"{name}:{at}"
                break
    return {
        "release": release,
        "wheel": wheel,
        "module": "sglang.benchmark.serving" if stubbed else "sglang.bench_serving",
        "file": impl,
        "deprecated_stub": (
            {"file": STUB, "line": _line_of(stub_text.splitlines(), FORWARD)} if stubbed else None
        ),
        "flags": flags,
        "choices": choices,
        "fields": fields,
        "auth_env": auth,
    }


def releases() -> list[str]:
    data = yaml.safe_load((KNOWLEDGE / "sglang.yaml").read_text())
    return sorted(
        data["releases"], key=lambda v: [int(p) if p.isdigit() else p for p in re.split(r"[.]", v)]
    )


def render(release: str, cache_dir: Path) -> str:
    wheel, src = unpacked_release(cache_dir / f"sglang-{release}-stubbed", "sglang", release)
    data = read_release(src, release, wheel.name)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("versions", nargs="*")
    parser.add_argument("--all", action="store_true", help="every release of sglang.yaml")
    parser.add_argument("--check", action="store_true", help="no diff, or exit 1")
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    versions = releases() if args.all else args.versions
    cache = args.cache_dir or default_cache_dir()
    stale = []
    for version in versions:
        text = render(version, cache)
        path = OUT_DIR / f"sglang-{version}.json"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(REPO_ROOT)))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    if stale:
        print("stale (run scripts/gen_bench_client.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
