"""`python -m operations.kb intake VERSION` drafts the next release; `--check VERSION` compares.

    python -m operations.kb intake 0.5.24           # metadata, CLI table, asserts, draft entry
    python -m operations.kb intake 0.5.24 --write   # ... and add the draft to sglang.yaml
    python -m operations.kb --check 0.5.22          # exit 1 when the committed entry differs

`intake` needs the main index (PyPI, through pip); `--check` runs offline from the committed
fixtures. Every failure is one line on stderr (exit 2), never a traceback. See
docs/how-to/add-a-release.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import cast

import yaml

from operations import layout
from operations.kb import intake
from operations.kb.cli_tables import load_cli_table
from operations.kb.loader import load
from operations.kb.raw import CLI_DIR, KNOWLEDGE_DIR, KnowledgeError, RawRelease
from operations.kb.types import version

YAML = KNOWLEDGE_DIR / "sglang.yaml"
ASSERT_DIR = KNOWLEDGE_DIR / "asserts"
INSERT_BEFORE = '\n# Model architectures (config.json "architectures"[0])'
RELEASE = re.compile(r"[0-9]+(\.[0-9]+)*(\.post[0-9]+)?")
SNAPSHOT_NOTE = (
    "the real-metadata lock (tests/unit/test_real_metadata.py) fails for this release until the "
    "index snapshot holds it: python scripts/capture_index_snapshot.py --whl-repo "
    "<sgl-project/whl checkout> --release VERSION"
)


def _script(name: str) -> ModuleType:
    path = KNOWLEDGE_DIR.parents[2] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_intake_{name}", path)
    if spec is None or spec.loader is None:
        raise intake.IntakeError(f"{path} cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def committed_entry(release: str) -> RawRelease | None:
    data = yaml.safe_load(YAML.read_text())
    return cast(RawRelease | None, data["releases"].get(release))


def check(release: str) -> int:
    path = intake.metadata_path(release)
    if not path.exists():
        raise intake.IntakeError(
            f"sglang {release}: no captured METADATA {path.relative_to(intake.REPO)}; run "
            f"'{layout.command('kb')} intake {release}' first"
        )
    entry = committed_entry(release)
    if entry is None:
        raise intake.IntakeError(
            f"sglang {release} has no entry under releases in {YAML.relative_to(intake.REPO)}"
        )
    drafted = intake.draft(release, path.read_text(), entry.get("glibc", "2.34"))
    problems = intake.differences(entry, drafted.entry)
    for problem in problems:
        print(f"releases.{release}.{problem}")
    if problems:
        print(f"sglang {release}: the committed entry differs from what intake derives")
        return 1
    print(f"sglang {release}: the committed entry is what intake derives")
    return 0


def read_kernel_index(url: str, into: Path) -> None:
    """SGLang's live kernel index at `url` (<url>/<lane>/<project>/), in the fixture layout."""
    for lane in ("cu129", "cu130"):
        for project in ("sglang-kernel", "sgl-deep-gemm"):
            page = f"{url.rstrip('/')}/{lane}/{project}/"
            try:
                with urllib.request.urlopen(page, timeout=15) as reply:
                    text = reply.read().decode()
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise intake.IntakeError(
                    f"--kernel-index {url}: {page} is unreachable ({exc}); leave the option out "
                    "to read the committed snapshot (tests/fixtures/sglang-whl/)"
                ) from exc
            names = sorted(set(re.findall(r">([^<]+\.whl)<", text)))
            (into / lane).mkdir(parents=True, exist_ok=True)
            (into / lane / f"{project}.txt").write_text("\n".join(names) + "\n")


def previous_release(release: str, known: list[str]) -> str | None:
    older = [r for r in known if version(r) < version(release)]
    return max(older, key=version) if older else None


def table_diff(release: str, previous: str | None) -> list[str]:
    """Removed and newly deprecated options, and each renamed setting's spelling."""
    lines: list[str] = []
    new = load_cli_table("sglang", release, CLI_DIR)
    old = load_cli_table("sglang", previous, CLI_DIR) if previous else None
    if new is None:
        return [f"no CLI table for {release}"]
    if old is not None:
        removed = sorted(set(old.options) - set(new.options))
        if removed:
            lines.append(f"removed since {previous} ({len(removed)}): {', '.join(removed)}")
        deprecated = sorted(
            o
            for o, e in new.options.items()
            if e.deprecated and o in old.options and not old.options[o].deprecated
        )
        if deprecated:
            lines.append(f"deprecated since {previous}: {', '.join(deprecated)}")
    try:
        knowledge = load()
    except KnowledgeError:
        return lines
    for flag in knowledge.flags.all():
        spelling = flag.spelling(release)
        option = spelling.option if spelling else None
        entry = new.get(option) if option else None
        if option and (entry is None or entry.deprecated):
            found = "no" if entry is None else "only a deprecated"
            dest = entry.dest if entry else None
            other = [o for o, e in new.options.items() if e.dest == dest and not e.deprecated]
            lines.append(
                f"UNDECIDED flags.{flag.setting}: sglang {release} has {found} option {option}"
                + (f"; its replacement reads {', '.join(other)}" if other else "")
                + ": add a spelling range"
            )
    return lines


def assert_diff(release: str, previous: str | None) -> list[str]:
    path = ASSERT_DIR / f"sglang-{release}.json"
    if not path.exists():
        return []
    new = json.loads(path.read_text())["asserts"]
    old_path = ASSERT_DIR / f"sglang-{previous}.json"
    old = json.loads(old_path.read_text())["asserts"] if previous and old_path.exists() else {}
    pairs = {(f, m) for f, ms in new.items() for m in ms}
    before = {(f, m) for f, ms in old.items() for m in ms}
    lines = [f"new start-up assert: {f}: {m}" for f, m in sorted(pairs - before)]
    try:
        rules = load().start_asserts
    except KnowledgeError:
        return lines
    lines += [
        f"UNDECIDED start_asserts: {f}: {m!r} is neither anticipated nor listed unreachable"
        for f, m in sorted(pairs)
        if not any(r.covers(f, m) for r in rules)
    ]
    return lines


def run_intake(release: str, write: bool, kernel_index: str | None) -> int:
    gen = _script("gen_cli_table")
    cache = gen.default_cache_dir()
    try:
        wheel = gen.fetch_release(cache / f"sglang-{release}-stubbed", "sglang", release)
    except SystemExit as exc:
        raise intake.IntakeError(str(exc)) from None
    meta = intake.metadata_path(release)
    text = "\n".join(
        line
        for line in gen.read_metadata(wheel).splitlines()
        if line.split(":", 1)[0] in ("Name", "Version", "Requires-Python", "Requires-Dist")
    )
    meta.write_text(text + "\n")
    print(f"wrote {meta.relative_to(intake.REPO)} (the wheel's METADATA)")
    try:
        table = gen.generate("sglang", release, cache)
    except SystemExit as exc:
        raise intake.IntakeError(str(exc)) from None
    out = CLI_DIR / f"sglang-{release}.json"
    out.write_text(table)
    print(f"wrote {out.relative_to(intake.REPO)} ({len(json.loads(table)['options'])} options)")
    if release in gen.ASSERTS:
        (ASSERT_DIR / f"sglang-{release}.json").write_text(gen.ASSERTS[release])
        print(f"wrote operations/kb/knowledge/asserts/sglang-{release}.json")
    load_cli_table.cache_clear()
    glibc = "2.34" if "manylinux_2_34" in wheel.name else "2.28"
    with tempfile.TemporaryDirectory() as tmp:
        whl_dir = intake.WHL_DIR
        if kernel_index:
            read_kernel_index(kernel_index, Path(tmp))
            whl_dir = Path(tmp)
        drafted = intake.draft(release, meta.read_text(), glibc, whl_dir)
    known = list(yaml.safe_load(YAML.read_text())["releases"])
    previous = previous_release(release, known)
    body = yaml.safe_dump({release: drafted.entry}, sort_keys=False, width=100)
    block = "\n".join("  " + line if line else line for line in body.splitlines())
    print(f"\n# the draft entry (under `releases:` in {YAML.relative_to(intake.REPO)}):")
    print(block)
    print(f"\n# compared with sglang {previous}:" if previous else "\n# no earlier release known")
    for line in table_diff(release, previous) + assert_diff(release, previous):
        print(line)
    for line in drafted.undecided:
        print(f"UNDECIDED {line}")
    print(f"UNDECIDED {SNAPSHOT_NOTE.replace('VERSION', release)}")
    if write:
        if release in known:
            raise intake.IntakeError(f"sglang {release} already has an entry; edit it by hand")
        source = YAML.read_text()
        YAML.write_text(source.replace(INSERT_BEFORE, "\n" + block + "\n" + INSERT_BEFORE, 1))
        print(f"added the draft to {YAML.relative_to(intake.REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=layout.command("kb"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", nargs="?", choices=["intake"], help="draft a release")
    ap.add_argument("version", nargs="?", help="exact release, e.g. 0.5.24")
    ap.add_argument("--check", metavar="VERSION", help="compare the committed entry")
    ap.add_argument("--write", action="store_true", help="add the draft to sglang.yaml")
    ap.add_argument("--kernel-index", metavar="URL", help="read SGLang's live kernel index")
    args = ap.parse_args(argv)
    release = args.check or args.version
    if release is None or (args.check is None and args.command is None):
        ap.error("give 'intake VERSION' or '--check VERSION'")
    if not RELEASE.fullmatch(release):
        print(f"error: {release!r} is not a release number (e.g. 0.5.24)", file=sys.stderr)
        return 2
    try:
        if args.check:
            return check(release)
        return run_intake(release, args.write, args.kernel_index)
    except (intake.IntakeError, KnowledgeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: {first}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
