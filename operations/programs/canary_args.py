"""What the canary comparison is given (programs/canary_compare.py): its command line, --meta
and --rollback, checked. Anything the plan could not have written is Refused
(throughput_args.Refused: one line naming it); nothing has run yet.

Not run on its own: inlined into canary_compare.py by operations/render/host_scripts.py.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import string
from typing import NoReturn

from operations.programs.load_runner import add_load_flags
from operations.programs.program_main import Refused, checked_url, unit_urls
from operations.programs.roll_steps import WRITE, Step, steps_of

CANARY_PLAN = "the deploy's plan writes it"
# What the record takes from --meta (the rest of it is ignored).
META_FIELDS = ("release", "engine", "canary_ranks", "baseline_rank", "baseline_ranks")
META_REQUIRED = ("release", "engine")


class _CanaryParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Refused(f"the command line: {message} ({CANARY_PLAN})")


def parse_canary(argv: list[str]) -> argparse.Namespace:
    parser = _CanaryParser(prog="canary_compare.py")
    parser.add_argument("--canary", action="append", required=True, metavar="UNIT=API_BASE")
    parser.add_argument("--baseline", action="append", required=True, metavar="UNIT=API_BASE")
    parser.add_argument("--held", action="append", default=[], metavar="UNIT")
    for name in ("--service-user", "--record", "--target", "--meta"):
        parser.add_argument(name, required=True)
    parser.add_argument("--key-file")
    parser.add_argument("--max-slowdown", type=float, required=True)
    parser.add_argument("--soak", type=float, required=True)
    parser.add_argument("--router-metrics", default=None)
    parser.add_argument("--worker", action="append", default=[], metavar="UNIT=WORKER_URL")
    add_load_flags(parser)  # the speed row's load (plan/throughput_plan.load_flags)
    parser.add_argument("--rollback", default=None, metavar="STEPS_JSON")
    parser.add_argument("--pause", action="store_true")
    return parser.parse_args(argv)


def server_root(api_base: str) -> str:
    """A rank's server root from its OpenAI base (layout.rank_api_base: ROOT/v1)."""
    return api_base[: -len("/v1")] if api_base.endswith("/v1") else api_base


def canary_meta(text: str) -> dict[str, object]:
    try:
        meta = json.loads(text)
    except ValueError as error:
        raise Refused(f"--meta is not JSON ({error}; {CANARY_PLAN})") from None
    if not isinstance(meta, dict) or any(f not in meta for f in META_REQUIRED):
        raise Refused(f"--meta is not a JSON object with {', '.join(META_REQUIRED)}")
    return {f: meta[f] for f in META_FIELDS if f in meta}


def read_rollback(text: str | None) -> list[Step] | None:
    """--rollback's steps (roll_steps.steps_of); a `write` step is refused: it would read its
    content from this program's stdin, which carries none."""
    if text is None:
        return None
    try:
        steps = steps_of(json.loads(text))
    except ValueError as error:
        raise Refused(f"--rollback is not a roll batch's steps ({error}; {CANARY_PLAN})") from None
    if not steps or any(name == WRITE for name, _, _ in steps):
        raise Refused(f"--rollback has no steps, or a `{WRITE}` step (no content comes here)")
    return steps


def record_directory(path: str) -> None:
    """The record's directory must be there, this user's (root's on the host) and writable by
    no one else: the record is a new file renamed over the old one there."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(directory)
    except OSError as error:
        raise Refused(
            f"--record: its directory {directory} cannot be read ({error.strerror})"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise Refused(f"--record: {directory} is not a directory")
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise Refused(
            f"--record: {directory} is not this user's alone (uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}): make it root's, 0755"
        )


def checked(
    args: argparse.Namespace,
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(canaries, the baselines in the plan's order: the first is the reference while it is
    healthy, workers by unit), each value checked; Refused otherwise."""
    canaries = unit_urls(args.canary, "--canary", CANARY_PLAN)
    baselines = unit_urls(args.baseline, "--baseline", CANARY_PLAN)
    both = sorted(set(baselines) & set(canaries))
    if both:
        raise Refused(f"{', '.join(both)} is both a baseline and a canary ({CANARY_PLAN})")
    bad = [u for u in args.held if not u or "=" in u or u in canaries or u in baselines]
    if bad:
        raise Refused(f"--held {bad[0]!r} is not a unit apart from the compared ones")
    for name in ("input_len", "output_len", "start", "most", "rounds"):
        if getattr(args, name) < 1:
            raise Refused(f"--{name.replace('_', '-')} must be 1 or more")
    if not 0 <= args.max_slowdown < 1:
        raise Refused("--max-slowdown must be at least 0 and under 1")
    if not args.soak >= 0 or not args.timeout > 0:
        raise Refused("--soak must be 0 or more and --timeout more than 0")
    if not args.target or any(c not in string.hexdigits for c in args.target):
        raise Refused(f"--target {args.target!r} is not a hex digest")
    workers = unit_urls(args.worker, "--worker", CANARY_PLAN)
    if args.router_metrics is not None:
        checked_url(args.router_metrics, "--router-metrics")
        missing = sorted((set(canaries) | set(baselines)) - set(workers))
        if missing:
            raise Refused(f"--router-metrics without a --worker for {', '.join(missing)}")
    elif workers:
        raise Refused("--worker without --router-metrics")
    return canaries, baselines, workers
