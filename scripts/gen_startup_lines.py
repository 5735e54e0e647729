#!/usr/bin/env python3
"""Generate the start-up knowledge of one SGLang release, read from its wheel.

Usage::

    python scripts/gen_startup_lines.py 0.5.23            # writes the file
    python scripts/gen_startup_lines.py 0.5.23 --check    # fails if the committed one differs

Downloads the release's wheel from PyPI once (the cp311 manylinux wheel, or the pure one; the
download and its cache are scripts/gen_cli_table.py's), reads its sources with `ast` (nothing is
imported or run) and writes ``operations/kb/knowledge/startup/sglang-<release>.json``:

- ``phases``: for each start-up phase, every log call of the release that marks it: the message
  as written (an f-string with its holes as ``{expression:spec}``, or a %-format), where it is
  (``file:line`` under ``sglang/``), and a Python regex that finds the message in a log line
  (``re.search``); its group ``seconds`` is the phase's own duration where the message tells
  one, ``name``/``backend`` which CUDA graph a capture line is about;
- ``caches``: what the release does with compile caches (``SGLANG_CACHE_DIR``'s default, the
  third-party cache variables it setdefaults under it, and where);
- ``pins``: the FlashInfer, flashinfer-cubin and torch its METADATA pins;
- ``defaults``: start-up related defaults of ``ServerArgs`` (``watchdog_timeout``,
  ``startup_weight_load_mode``) with their line.

The output is deterministic, so running the script again for a committed release gives no diff.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import json
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "operations" / "kb" / "knowledge" / "startup"
sys.path.insert(0, str(REPO_ROOT))

from scripts import gen_cli_table  # noqa: E402  (the wheel download and its cache)

# Phase -> what its message looks like, over the message's skeleton (its literal text with each
# hole written `{}`). Found in the wheels of 0.5.9-0.5.23; a phase no file of a release matches
# is written as an empty list (the release does not log it).
PHASES: dict[str, str] = {
    "parallel_init_begin": r"^Init (torch distributed|parallel) begin\.",
    "parallel_init_end": r"^Init (torch distributed|parallel) ends\. elapsed=",
    "weight_load_begin": r"^Load weight begin\.",
    "weight_load_end": r"^Load weight end\. ",
    "graph_capture_begin": r"^Capture .*(graph|\{\}) begin\b",
    "graph_capture_end": r"^Capture .*(graph|\{\}) end\. ",
    "flashinfer_autotune_begin": r"^Running FlashInfer autotune\b",
    "flashinfer_autotune_end": r"^FlashInfer autotune completed\.",
    "warmup_end": r"^(Warmup ended|End of disaggregation warmup)$",
    "ready": r"^The server is fired up and ready to roll!$",
}
# Phases whose every message must carry its own duration (a `seconds` group).
TIMED = ("parallel_init_end", "weight_load_end", "graph_capture_end")
# The text right before a duration hole.
_SECONDS_BEFORE = re.compile(r"(elapsed=|Time elapsed: |capture in )$")
_LOG_METHODS = {"debug", "info", "warning", "error", "critical"}
_SECONDS = r"(?P<seconds>[0-9]+(?:\.[0-9]+)?)"
_PERCENT = re.compile(r"%(?:\([a-z_]+\))?[-+ #0]*[0-9*]*(?:\.[0-9*]+)?[diouxXeEfFgGcrsa%]")
# Where the phases are logged: the whole runtime but other devices' backends.
SOURCE_GLOB = "sglang/srt/**/*.py"
SKIP_DIRS = ("sglang/srt/hardware_backend/",)


@dataclass(frozen=True)
class Hole:
    expr: str  # the expression as written (ast.unparse)
    spec: str  # f-string format spec or %-conversion ('' for none)


Part = str | Hole


@dataclass(frozen=True)
class Message:
    path: str  # under the wheel's root
    line: int
    parts: tuple[Part, ...]
    style: str  # "f-string" | "percent" | "plain"

    @property
    def skeleton(self) -> str:
        return "".join(p if isinstance(p, str) else "{}" for p in self.parts)

    @property
    def format(self) -> str:
        if self.style == "percent":
            return "".join(p if isinstance(p, str) else p.spec for p in self.parts)
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(p.replace("{", "{{").replace("}", "}}"))
            else:
                out.append("{" + p.expr + (":" + p.spec if p.spec else "") + "}")
        return "".join(out)


def _message_arg(call: ast.Call) -> tuple[ast.expr, list[ast.expr]] | None:
    """The message and %-arguments of a logging call (logger.info(msg, ...),
    log_info_on_rank0(logger, msg, ...)); None for any other call."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _LOG_METHODS and call.args:
        return call.args[0], list(call.args[1:])
    if isinstance(func, ast.Name) and func.id == "log_info_on_rank0" and len(call.args) >= 2:
        return call.args[1], list(call.args[2:])
    return None


def _parts(node: ast.expr, args: list[ast.expr]) -> tuple[tuple[Part, ...], str] | None:
    if isinstance(node, ast.JoinedStr):
        parts: list[Part] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                spec = ""
                if isinstance(value.format_spec, ast.JoinedStr):
                    spec = "".join(
                        str(v.value) if isinstance(v, ast.Constant) else "{}"
                        for v in value.format_spec.values
                    )
                parts.append(Hole(ast.unparse(value.value), spec))
        return _merged(parts), "f-string"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
        if not args:
            return (text,), "plain"
        parts = []
        pos, index = 0, 0
        for m in _PERCENT.finditer(text):
            parts.append(text[pos : m.start()])
            if m.group() == "%%":
                parts.append("%")
            else:
                expr = ast.unparse(args[index]) if index < len(args) else "?"
                parts.append(Hole(expr, m.group()))
                index += 1
            pos = m.end()
        parts.append(text[pos:])
        return _merged(parts), "percent"
    return None


def _merged(parts: list[Part]) -> tuple[Part, ...]:
    out: list[Part] = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] = out[-1] + p
        elif p != "":
            out.append(p)
    return tuple(out)


def messages(src: Path) -> Iterator[Message]:
    """Every logging call with a literal message under sglang/srt, in path and line order."""
    for path in sorted(src.glob(SOURCE_GLOB)):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(SKIP_DIRS):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        found = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            arg = _message_arg(node)
            if arg is None:
                continue
            parsed = _parts(*arg)
            if parsed is None:
                continue
            found.append(Message(rel, arg[0].lineno, parsed[0], parsed[1]))
        yield from sorted(found, key=lambda m: m.line)


def regex(message: Message) -> str:
    """A regex that finds the message in a log line: its literal text escaped, each hole a
    group; the duration hole (after 'elapsed=', 'Time elapsed: ', 'capture in ') `seconds`,
    the capture's name `name`, the graph kind `backend`, any other hole unnamed."""
    out: list[str] = []
    before = ""
    named: set[str] = set()
    for part in message.parts:
        if isinstance(part, str):
            out.append(re.escape(part))
            before = part
            continue
        group = None
        if _SECONDS_BEFORE.search(before) and part.spec in {".2f", "%.2f", ".1f", ".0f"}:
            group = "seconds"
        elif part.expr == "capture_name":
            group = "name"
        elif part.expr.startswith("graph_backend["):
            group = "backend"
        if group is None or group in named:
            out.append("(?:.*?)")
        elif group == "seconds":
            out.append(_SECONDS)
        elif group == "backend":  # graph_backend's values: "cuda graph", "CUDA graph", ...
            out.append(r"(?P<backend>[A-Za-z]+ graph)")
        else:
            out.append(f"(?P<{group}>.+?)")
        if group is not None:
            named.add(group)
        before = ""
    return "".join(out)


def phases(src: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in PHASES}
    for message in messages(src):
        for name, pattern in PHASES.items():
            if not re.search(pattern, message.skeleton):
                continue
            entry = found[name].setdefault(
                message.format,
                {"format": message.format, "regex": regex(message), "style": message.style},
            )
            entry.setdefault("sources", []).append(f"{message.path}:{message.line}")
    out: dict[str, list[dict[str, Any]]] = {}
    for name, entries in found.items():
        lines = sorted(entries.values(), key=lambda e: (e["sources"][0], e["format"]))
        for e in lines:
            e["timed"] = "(?P<seconds>" in e["regex"]
            if name in TIMED and not e["timed"]:
                raise SystemExit(f"{name}: {e['sources'][0]} has no duration: {e['format']!r}")
        out[name] = lines
    for must in ("weight_load_end", "graph_capture_end", "ready"):
        if not out[must]:
            raise SystemExit(f"no {must} line found under {SOURCE_GLOB}")
    return out


def _line_of(tree: ast.AST, predicate: Any) -> ast.AST | None:
    return next((n for n in ast.walk(tree) if predicate(n)), None)


def caches(src: Path) -> dict[str, Any]:
    """SGLANG_CACHE_DIR's default and the variables `third_party_cache_defaults` setdefaults
    under it (0.5.18+), with their lines; the call that applies them (sglang/__init__.py)."""
    environ = src / "sglang/srt/environ.py"
    tree = ast.parse(environ.read_text(encoding="utf-8"))
    out: dict[str, Any] = {"sglang_cache_dir": None, "third_party": None}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "SGLANG_CACHE_DIR" for t in node.targets)
            and isinstance(node.value, ast.Call)
            and node.value.args
        ):
            out["sglang_cache_dir"] = {
                "default": _text(node.value.args[0]),
                "source": f"sglang/srt/environ.py:{node.lineno}",
            }
    func = _line_of(
        tree, lambda n: isinstance(n, ast.FunctionDef) and n.name == "third_party_cache_defaults"
    )
    if isinstance(func, ast.FunctionDef):
        ret = _line_of(func, lambda n: isinstance(n, ast.Return) and isinstance(n.value, ast.Dict))
        assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict)
        variables = {}
        for key, value in zip(ret.value.keys, ret.value.values, strict=True):
            assert isinstance(key, ast.Constant)
            variables[str(key.value)] = _text(value)
        init = src / "sglang/__init__.py"
        call = None
        for n, text in enumerate(init.read_text(encoding="utf-8").splitlines(), start=1):
            if re.match(r"_?redirect_third_party_caches\(\)", text.strip()):
                call = f"sglang/__init__.py:{n}"
        out["third_party"] = {
            "variables": variables,
            "source": f"sglang/srt/environ.py:{func.lineno}-{func.end_lineno}",
            "applied_by": call,
            "how": "os.environ.setdefault: a variable already set wins",
        }
    return out


def _text(node: ast.expr) -> str:
    """A path expression as a short text: os.path.join(base, "triton") -> "{base}/triton"."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Name):
        return "{" + node.id + "}"
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        if name == "os.path.join":
            return "/".join(_text(a) for a in node.args)
        if name == "os.path.expanduser" and node.args:
            return _text(node.args[0])
    return ast.unparse(node)


DEFAULTS = ("watchdog_timeout", "startup_weight_load_mode")
# Where ServerArgs' fields are declared: server_args.py, and from 0.5.19 on also the argument
# groups' field modules.
DEFAULT_FILES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/**/*.py")


def defaults(src: Path) -> dict[str, Any]:
    """Start-up related ServerArgs defaults (class-level `name: type = value`), each with its
    line; a field the release does not have is absent."""
    out: dict[str, Any] = {}
    for pattern in DEFAULT_FILES:
        for path in sorted(src.glob(pattern)):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for cls in ast.walk(tree):
                if not isinstance(cls, ast.ClassDef):
                    continue
                for node in cls.body:
                    if (
                        isinstance(node, ast.AnnAssign)
                        and isinstance(node.target, ast.Name)
                        and node.target.id in DEFAULTS
                        and node.target.id not in out
                        and node.value is not None
                    ):
                        out[node.target.id] = {
                            "value": ast.literal_eval(node.value),
                            "source": f"{path.relative_to(src).as_posix()}:{node.lineno}",
                        }
    return dict(sorted(out.items()))


PINNED = ("flashinfer-python", "flashinfer-cubin", "torch")


def pins(wheel: Path) -> dict[str, str | None]:
    """The exact versions of PINNED in the wheel's METADATA Requires-Dist (extras ignored;
    None where the release does not require it)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(name).decode())
    found: dict[str, str | None] = dict.fromkeys(PINNED)
    for req in meta.get_all("Requires-Dist") or []:
        if ";" in req:
            continue
        m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*==\s*([^\s,;]+)\s*", req)
        if m and gen_cli_table.normalize(m.group(1)) in found:
            found[gen_cli_table.normalize(m.group(1))] = m.group(3)
    return found


def unpacked(release: str, cache_dir: Path) -> tuple[Path, Path]:
    work = cache_dir / f"sglang-{release}-stubbed"
    return gen_cli_table.unpacked_release(work, "sglang", release)


def generate(release: str, cache_dir: Path) -> str:
    wheel, src = unpacked(release, cache_dir)
    doc = {
        "package": "sglang",
        "version": release,
        "source": f"sglang=={release} wheel from PyPI ({wheel.name}), read with ast",
        "generated_by": f"scripts/gen_startup_lines.py {release}",
        "phases": phases(src),
        "caches": caches(src),
        "pins": pins(wheel),
        "defaults": defaults(src),
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("release", help="exact SGLang release, e.g. 0.5.23")
    ap.add_argument("--cache-dir", type=Path, default=None, help="where wheels are kept")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument(
        "--check", action="store_true", help="do not write; fail if the committed file differs"
    )
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*(\.post[0-9]+)?", args.release):
        ap.error(f"not an exact release version: {args.release}")
    text = generate(args.release, args.cache_dir or gen_cli_table.default_cache_dir())
    out = args.out_dir / f"sglang-{args.release}.json"
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"gen_startup_lines: {out} is missing or differs", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"gen_startup_lines: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
