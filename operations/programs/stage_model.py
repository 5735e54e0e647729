#!/usr/bin/env python3
"""Stage a model directory into a tmpfs: manifest-compared, atomic, resumable.

The one staging code path: the deploy runs it over SSH and the boot unit
(sglang-stage-model.service) runs it at boot. It runs with the host's python3 and the standard
library only, because it must work on a bare container before any engine is installed.

Layout under STAGE_DIR/models (SLUG is the served name made path-safe):
  SLUG               symlink -> .SLUG@KEY: the newest complete copy
  .SLUG@KEY/         a complete copy (KEY: the deploy's --key, else the digest); each rank unit
                     names one by path, and copies a unit names are kept (--keep)
  .SLUG.tmp-PID/     a copy in progress; never visible under SLUG, removed by the next run
  .SLUG.lock         flock: the boot unit and a deploy never stage at the same time

Subcommands (output is JSON on the last stdout line; progress lines go before it):
  scan SOURCE                               the source's manifest summary
  plan SOURCE STAGE_DIR SLUG [--verify V] [--key K] [--keep KEY ...]
                                            what a stage run with that key and keep would do
                                            (read only; the ModelStaging fact)
  stage SOURCE STAGE_DIR SLUG [...]         copy what changed, verify, switch, clean up
  prune STAGE_DIR SLUG [--keep KEY ...]     remove the copies no rank unit names any more
  fetch-hub --cli HF --repo R --revision V --dest DIR [--token-file F]

Its parts are modules beside it, one job each: stage_manifest.py (the source's manifest),
stage_tree.py (the copies under STAGE_DIR/models, the lock, the prune), stage_copy.py (copy and
verify), stage_run.py (plan and stage); operations/render/host_scripts.py inlines them, so the host
gets one file (and the ModelStaging fact one `python3 -c` argument).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
from typing import TypedDict

from operations.programs.stage_copy import STOP, set_group
from operations.programs.stage_manifest import (
    EXIT_REFUSED,
    HUB_MARKER,
    StageError,
    _read_text,
    scan,
)
from operations.programs.stage_run import Plan, Staged, Summary, plan, stage
from operations.programs.stage_tree import Pruned, prune

# --------------------------------------------------------------------------------- hub


def fetch_hub(cli: str, repo: str, revision: str, dest: str, token_file: str | None) -> bool:
    """Download repo@revision into dest with the hub's own CLI, once. True when it downloaded."""
    marker = os.path.join(dest, HUB_MARKER)
    if _read_text(dest, HUB_MARKER) == revision:
        return False
    os.makedirs(dest, mode=0o750, exist_ok=True)
    os.chmod(dest, 0o750)  # the hub cache is read by root's staging run only
    env = dict(os.environ)
    if token_file:
        # The token reaches the CLI through its environment only: never argv, never a log.
        env["HF_TOKEN"] = _read_text(*os.path.split(token_file)) or ""
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    argv = [cli, "download", repo, "--revision", revision, "--local-dir", dest]
    print(f"stage: downloading {repo}@{revision} into {dest}", flush=True)
    import subprocess  # the hub download's only: the plan (every deploy) runs none

    try:
        proc = subprocess.run(argv, env=env, check=False)
    except OSError as exc:
        raise StageError(f"cannot run the hub CLI {cli}: {exc.strerror}", EXIT_REFUSED) from None
    if proc.returncode != 0:
        raise StageError(f"{cli} download {repo}@{revision} failed (exit {proc.returncode})")
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    temp = f"{marker}.tmp-{os.getpid()}"
    with open(temp, "w") as fh:
        fh.write(revision + "\n")
    os.rename(temp, marker)
    return True


class Fetched(TypedDict):
    """`fetch-hub`'s answer."""

    changed: bool  # it downloaded


def _may_chown() -> bool:
    """Whether this process holds CAP_CHOWN (capability 0) in its effective set."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _raise_exit(signum: int, frame: object) -> None:
    STOP.set()
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stage_model.py", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("scan")
    p.add_argument("source")
    p = sub.add_parser("plan")
    for name in ("source", "stage_dir", "slug"):
        p.add_argument(name)
    p.add_argument("--verify", choices=["manifest", "full"], default="manifest")
    p.add_argument("--key", help="the copy's name, .SLUG@KEY (default: its digest)")
    p.add_argument("--keep", action="append", default=[], help="a copy's key a unit names")
    p = sub.add_parser("stage")
    for name in ("source", "stage_dir", "slug"):
        p.add_argument(name)
    p.add_argument("--mode", choices=["beside", "inplace", "auto"], default="beside")
    p.add_argument("--verify", choices=["manifest", "full"], default="manifest")
    p.add_argument("--progress-interval", type=float, default=2.0)
    p.add_argument("--bwlimit-mbps", type=float, default=None)
    p.add_argument("--lock-timeout", type=float, default=1800.0)
    p.add_argument(
        "--headroom", type=float, default=1.0, help="free bytes a copied byte needs (the plan's)"
    )
    p.add_argument("--group", help="the servers' group: copies are root:GROUP 0750/0640")
    p.add_argument("--key", help="the copy's name, .SLUG@KEY (default: its digest)")
    p.add_argument("--keep", action="append", default=[], help="a copy's key a unit names")
    p = sub.add_parser("prune")
    for name in ("stage_dir", "slug"):
        p.add_argument(name)
    p.add_argument("--keep", action="append", default=[], help="a copy's key a unit names")
    p = sub.add_parser("fetch-hub")
    p.add_argument("--cli", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--token-file")
    args = parser.parse_args(argv)
    group = getattr(args, "group", None)
    if group and not _may_chown():
        # A unit whose capability bounding set lacks CAP_CHOWN: the servers must still read
        # the copy, so it is staged as before (world-readable) rather than not at all.
        print(f"stage: warning: no CAP_CHOWN, the copy cannot be given to group {group!r}")
        group = None
    if args.cmd == "fetch-hub" or group:
        # Nothing made here is for other users: the hub cache, manifests, copies (the servers
        # read those through their group).
        os.umask(0o027)
    if group:
        try:
            import grp

            set_group(grp.getgrnam(group).gr_gid)
        except KeyError:
            print(f"stage: error: group {group!r} does not exist", file=sys.stderr)
            return EXIT_REFUSED
    # A stop (systemctl stop, the deploy's SSH session closing) unwinds like an exception, so
    # the copy in progress is removed on the way out; SIGKILL leaves it for the next run.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    try:
        out: Summary | Plan | Staged | Pruned | Fetched  # the last stdout line, as JSON
        if args.cmd == "scan":
            found = scan(args.source)
            out = {"digest": found["digest"], "bytes": found["bytes"], "files": len(found["files"])}
        elif args.cmd == "plan":
            out = plan(
                args.source, args.stage_dir, args.slug, args.verify, args.key, tuple(args.keep)
            )
        elif args.cmd == "stage":
            bw = args.bwlimit_mbps * 1e6 if args.bwlimit_mbps else None
            out = stage(
                args.source,
                args.stage_dir,
                args.slug,
                args.mode,
                args.verify,
                args.progress_interval,
                bw,
                args.lock_timeout,
                args.key,
                tuple(args.keep),
                headroom=args.headroom,
            )
        elif args.cmd == "prune":
            out = prune(args.stage_dir, args.slug, tuple(args.keep))
        else:
            downloaded = fetch_hub(args.cli, args.repo, args.revision, args.dest, args.token_file)
            out = {"changed": downloaded}
    except StageError as exc:
        print(f"stage: error: {exc}", file=sys.stderr, flush=True)
        return exc.code
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            print(
                f"stage: error: {exc.filename}: no space left; nothing was switched",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        print(f"stage: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
