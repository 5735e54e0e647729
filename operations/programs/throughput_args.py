"""What the throughput check is given (programs/throughput.py): its command line, --meta and
--ceilings, checked, and the records so far. Anything the plan could not have written is
Refused, one line naming it and where it comes from; nothing has run yet.

Not run on its own: inlined into throughput.py (operations/render/host_scripts.py).
"""

from __future__ import annotations

import argparse
import json
from typing import NoReturn, cast

from operations.programs.load_runner import add_load_flags
from operations.programs.program_main import Refused
from operations.programs.throughput_guard import Ceilings, Meta, Record

PLAN = "the deploy's plan writes it: operations/plan/throughput_plan.py"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Refused(f"the command line: {message} ({PLAN})")


def read_meta(text: str) -> Meta:
    """--meta, checked for the fields a record starts with."""
    try:
        meta = json.loads(text)
    except ValueError as error:
        raise Refused(f"--meta is not JSON ({error}; {PLAN})") from None
    fields = ("release", "engine", "model_digest", "flags_digest", "workload", "server_args")
    if not isinstance(meta, dict) or any(f not in meta for f in fields):
        raise Refused(f"--meta is not a JSON object with {', '.join(fields)} ({PLAN})")
    shape = ("input_len", "output_len", "ranks")
    if not isinstance(meta["workload"], dict) or any(f not in meta["workload"] for f in shape):
        raise Refused(f"--meta's workload is not a JSON object with {', '.join(shape)} ({PLAN})")
    for name in ("gpu", "driver", "router"):
        meta.setdefault(name, None)
    return cast(Meta, meta)


def read_ceilings(text: str | None) -> Ceilings | None:
    """--ceilings (throughput_guard.Ceilings), checked; None when not given."""
    if not text:
        return None
    try:
        ceilings = json.loads(text)
    except ValueError as error:
        raise Refused(f"--ceilings is not JSON ({error}; {PLAN})") from None
    numbers = ("one_stream_tok_s", "full_batch_tok_s")
    if (
        not isinstance(ceilings, dict)
        or not all(isinstance(ceilings.get(n), (int, float)) for n in numbers)
        or not isinstance(ceilings.get("source"), str)
    ):
        raise Refused(
            f"--ceilings is not a JSON object with numbers {' and '.join(numbers)} and a "
            f"source ({PLAN})"
        )
    return cast(Ceilings, ceilings)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="throughput.py")
    parser.add_argument("--rank", action="append", required=True)
    add_load_flags(parser)
    parser.add_argument("--key-file")
    parser.add_argument("--service-user", required=True)
    parser.add_argument("--records", required=True)
    # Present from the start of a check until one passes (layout.THROUGHPUT_PENDING).
    parser.add_argument("--pending", default=None)
    parser.add_argument("--meta", required=True)
    parser.add_argument("--max-slowdown", type=float, required=True)
    parser.add_argument("--guard", choices=("fail", "warn"), required=True)
    parser.add_argument("--time", default=None)
    # The card's ceilings as JSON (throughput_guard.Ceilings); absent: not shown.
    parser.add_argument("--ceilings", default=None)
    return parser.parse_args(argv)


def read_records(path: str) -> list[Record]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise Refused(
            f"the records {path} cannot be read ({type(error).__name__}: {error.strerror}): "
            "remove what is there, or make it the records file it was"
        ) from None
    records = []
    for line in lines:
        try:
            read = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash: the others stand
        if isinstance(read, dict):
            records.append(cast(Record, read))
    return records
