#!/usr/bin/env python3
"""Generate the table of real command-line options of one SGLang, sglang-router or smg release.

Usage::

    python scripts/gen_cli_table.py sglang 0.5.11
    python scripts/gen_cli_table.py sglang-router 0.3.2
    python scripts/gen_cli_table.py smg 1.13.0

The script never touches the project's own virtualenv.  It creates (or reuses) a throwaway
virtualenv outside the repository, under ``~/.cache/sglang-deploy/cli-tables/<pkg>-<ver>``
(``--cache-dir`` or ``$SGLANG_DEPLOY_CACHE`` move it), downloads the release's wheel from PyPI with
``pip download --no-deps``, installs the wheel with ``--no-deps`` together with only what importing
the argument module needs (a CPU build of torch, transformers at the version the release pins,
and a few small packages), then builds the release's real ``argparse`` parser inside that
virtualenv and writes ``operations/kb/knowledge/cli/<pkg>-<ver>.json``.

No GPU is needed.  One import-time hack is applied (see ``scripts/cli_table_actions.py``): PyPI
only has CUDA builds of torchvision for x86_64 Linux, whose C extension cannot load next to a CPU
torch, and ``torchvision/_meta_registrations.py`` then fails hard while registering fake kernels
for the missing ``torchvision::*`` operators.  Those registrations only matter for torch.compile
tracing, so the module is replaced by an empty one before anything imports torchvision.  Nothing
of sglang is patched.  ``CUDA_VISIBLE_DEVICES`` is emptied for the child, so a GPU on the machine
running this script cannot change the result.

The output is deterministic (sorted keys, sorted choices, no help texts, no defaults), so running
the script again for a committed release must give no diff; ``--check`` verifies exactly that.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
TABLE_DIR = REPO_ROOT / "operations" / "kb" / "knowledge" / "cli"

# torch: always the CPU build.  Releases pin CUDA builds of torch (e.g. sglang 0.5.11 pins
# torch==2.11.0, which on PyPI is a multi-GB CUDA 13 build); the option table does not depend on
# the torch build, and a CPU wheel of 2.13.0 is small (and may already lie in a local wheel dir).
# torchvision must match torch exactly, or pip "upgrades" torch to a CUDA build to satisfy it.
TORCH_CONSTRAINTS = ("torch==2.13.0", "torchvision==0.28.0")

# Importable module name -> distribution name, for modules whose names differ.
MODULE_TO_DIST = {
    "PIL": "pillow",
    "zmq": "pyzmq",
    "yaml": "pyyaml",
    "google": "protobuf",
    "cv2": "opencv-python-headless",
    "sklearn": "scikit-learn",
    "multipart": "python-multipart",
    "dateutil": "python-dateutil",
    "IPython": "ipython",
    "partial_json_parser": "partial-json-parser",
}


@dataclass(frozen=True)
class Target:
    """How to read one package's parser."""

    dist: str  # PyPI distribution name
    module: str  # module holding the args class
    args_class: str  # class with a static add_cli_args(parser)
    # What the import needs beyond the wheel itself.  Where the release's METADATA pins a
    # package with ==, that exact version is installed.
    needs: tuple[str, ...] = field(default_factory=tuple)


TARGETS: dict[str, Target] = {
    "sglang": Target(
        dist="sglang",
        module="sglang.srt.server_args",
        args_class="ServerArgs",
        needs=(
            "torch",
            "torchvision",
            "transformers",
            "numpy",
            "pydantic",
            "orjson",
            "pyzmq",
            "psutil",
            "requests",
            "openai",
            "sentencepiece",
            "tokenizers",
            "safetensors",
            "setproctitle",
            "starlette",
            "triton",
            "pillow",
            "pybase64",
            "ipython",
            "aiohttp",
            "partial-json-parser",
            "dill",
            "msgspec",  # 0.5.19 and later
            "xgrammar",  # 0.5.19 (imported lazily in 0.5.23)
        ),
    ),
    "sglang-router": Target(
        dist="sglang-router",
        module="sglang_router.router_args",
        args_class="RouterArgs",
        needs=(),
    ),
    # smg (Shepherd Model Gateway), sglang-router's successor: `smg.launch_router`'s
    # parse_router_args builds its parser with RouterArgs.add_cli_args(parser,
    # use_router_prefix=False), the defaults `actions` calls it with. router_args imports the
    # wheel's own Rust extension (smg.smg_rs, cp38-abi3 manylinux) for the parser choices of
    # --reasoning-parser and --tool-call-parser: the stubbed method loads the real one (it runs
    # on any x86_64 glibc Linux) and stands in for nothing.
    "smg": Target(
        dist="smg",
        module="smg.router_args",
        args_class="RouterArgs",
        needs=(),
    ),
}

# Runs inside the throwaway virtualenv: builds the parser and prints the raw actions as JSON
# (scripts/cli_table_actions.py, which the stand-in method shares).
ACTIONS_SCRIPT = Path(__file__).resolve().parent / "cli_table_actions.py"

_DEPRECATED_HELP = re.compile(r"^\W*deprecated\b", re.IGNORECASE)
_HELP_ACTIONS = {"help", "version"}


def log(msg: str) -> None:
    print(f"[gen_cli_table] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def default_cache_dir() -> Path:
    env = os.environ.get("SGLANG_DEPLOY_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "sglang-deploy"
    return base / "cli-tables"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path) -> None:
    if venv.resolve().is_relative_to(REPO_ROOT):
        raise SystemExit(f"refusing to create the throwaway virtualenv inside the repo: {venv}")
    if venv_python(venv).exists():
        log(f"reusing {venv}")
        return
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(venv)])


def pip(venv: Path, *args: str) -> None:
    run([str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", *args])


def download_wheel(venv: Path, dist: str, version: str) -> Path:
    dest = venv / "wheels"
    dest.mkdir(exist_ok=True)
    pip(
        venv,
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-d",
        str(dest),
        f"{dist}=={version}",
    )
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{version}-")]
    if len(found) != 1:
        raise SystemExit(f"expected one wheel of {dist}=={version} in {dest}, found {found}")
    return found[0]


def read_metadata(wheel: Path) -> str:
    """The wheel's *.dist-info/METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def exact_pins(wheel: Path) -> dict[str, str]:
    """Unconditional ``name==version`` requirements of a wheel, keyed by normalized name."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
    pins: dict[str, str] = {}
    for req in meta.get_all("Requires-Dist") or []:
        if ";" in req:
            continue  # markers (extras, platforms): not what a plain import needs
        m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*\(?\s*==\s*([^\s,)]+)\s*\)?\s*", req)
        if m:
            pins[normalize(m.group(1))] = m.group(3)
    return pins


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement(name: str, pins: dict[str, str]) -> str:
    key = normalize(name)
    if key in {normalize(c.split("==")[0]) for c in TORCH_CONSTRAINTS}:
        return name  # version comes from the constraints file
    return f"{name}=={pins[key]}" if key in pins else name


def install(venv: Path, reqs: list[str]) -> None:
    constraints = venv / "cli-table-constraints.txt"
    constraints.write_text("\n".join(TORCH_CONSTRAINTS) + "\n")
    pip(venv, "install", "--only-binary", ":all:", "-c", str(constraints), *reqs)


def extract(venv: Path, target: Target, pins: dict[str, str]) -> list[dict[str, Any]]:
    """Build the parser in the venv; install a module the import asks for, up to 30 times."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SGLANG", "CUDA"))}
    env.update(
        CUDA_VISIBLE_DEVICES="",
        PYTHONHASHSEED="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    cmd = [str(venv_python(venv)), "-I", str(ACTIONS_SCRIPT), target.module, target.args_class]
    tried: set[str] = set()
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(30):
            log(f"building {target.module}.{target.args_class}.add_cli_args(...)")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
            if proc.returncode == 0:
                result: list[dict[str, Any]] = json.loads(proc.stdout)
                return result
            missing = re.findall(r"No module named '([^'.]+)", proc.stderr)
            if not missing or missing[-1] in tried:
                sys.stderr.write(proc.stderr)
                raise SystemExit(f"importing {target.module} failed (see above)")
            module = missing[-1]
            tried.add(module)
            dist = MODULE_TO_DIST.get(module, module)
            log(f"import asks for {module!r}: installing {dist} (add it to TARGETS' needs)")
            install(venv, [requirement(dist, pins)])
    raise SystemExit("gave up after 30 missing modules")


def is_deprecated(raw: dict[str, Any]) -> bool:
    return (
        bool(raw["deprecated_attr"])
        or any("Deprecated" in name for name in raw["mro"])
        or bool(_DEPRECATED_HELP.search(raw["help"]))
    )


def build_table(package: str, version: str, raw: list[dict[str, Any]]) -> dict[str, Any]:
    target = TARGETS[package]
    options: dict[str, dict[str, Any]] = {}
    for act in raw:
        if act["action"] in _HELP_ACTIONS and "-h" in act["option_strings"]:
            continue  # -h/--help: every parser has it
        nargs = act["nargs"]
        entry = {
            "dest": act["dest"],
            "takes_value": nargs != 0 and act["action"] not in _HELP_ACTIONS,
            "nargs": nargs,
            "choices": None if act["choices"] is None else sorted(act["choices"]),
            "action": act["action"],
            "deprecated": is_deprecated(act),
        }
        for opt in act["option_strings"]:
            if opt in options:
                raise SystemExit(f"{opt} registered twice")
            options[opt] = entry
    return {
        "package": package,
        "version": version,
        "source": (
            f"{target.dist}=={version} wheel from PyPI: "
            f"{target.module}.{target.args_class}.add_cli_args"
        ),
        "generated_by": f"scripts/gen_cli_table.py {package} {version}",
        "options": options,
    }


def render(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# The stubbed method (the default): the release's wheel unpacked, its parser built in a child
# `python -I -S` (scripts/cli_table_stubs.py) with these small pure packages real (sglang's
# arg modules subclass msgspec.Struct, compare packaging versions, pickle with dill) and every
# other module it cannot import replaced by a GPU-less stand-in, one at a time, starting with
# the heavy ones. No torch, no CUDA, nothing installed: ~10-20 MB downloaded per release.
STUBS_SCRIPT = Path(__file__).resolve().parent / "cli_table_stubs.py"
LIGHT = ("msgspec", "packaging", "typing-extensions", "dill")
FIRST_STUBS = ("torch", "triton", "transformers", "torchvision", "numpy")
_TAGS = ("manylinux_2_34", "manylinux_2_28", "manylinux_2_17", "manylinux2014")
WHEEL_PLATFORM = (
    "--python-version",
    "3.11",
    *(a for t in _TAGS for a in ("--platform", f"{t}_x86_64")),
)


def fetch_release(work: Path, dist: str, version: str) -> Path:
    """The release's wheel (cp311 manylinux x86_64, or pure), downloaded once into `work`."""
    dest = work / "wheels"
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{version}-")]
    if len(found) == 1:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--no-deps"]
    cmd += ["--only-binary", ":all:", *WHEEL_PLATFORM, "-d", str(dest), f"{dist}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{version}-")]
    if proc.returncode != 0 or len(found) != 1:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{dist}=={version}: no wheel downloaded from the package index ({last})")
    return found[0]


def unpacked_release(work: Path, dist: str, version: str) -> tuple[Path, Path]:
    """(the release's wheel, its files unpacked once into `work`/src)."""
    wheel = fetch_release(work, dist, version)
    src = work / "src"
    if not (src / ".unpacked").exists():
        shutil.rmtree(src, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(src)
        (src / ".unpacked").write_text(wheel.name + "\n")
    return wheel, src


def generate_stubbed(package: str, version: str, cache_dir: Path) -> str:
    target = TARGETS[package]
    work = cache_dir / f"{package}-{version}-stubbed"
    wheel, src = unpacked_release(work, target.dist, version)
    pins = exact_pins(wheel)
    light = work / "light"
    if package == "sglang" and not (light / ".installed").exists():
        shutil.rmtree(light, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q"]
        cmd += ["--only-binary", ":all:", "--no-deps", "--target", str(light)]
        run(cmd + [requirement(n, pins) for n in LIGHT])
        (light / ".installed").write_text("\n".join(LIGHT) + "\n")
    light.mkdir(parents=True, exist_ok=True)
    versions = {n.replace("-", "_"): v for n, v in pins.items()}
    stubs = list(FIRST_STUBS) if package == "sglang" else []
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(60):
            cmd = [sys.executable, "-I", "-S", str(STUBS_SCRIPT), target.module]
            cmd += [target.args_class, ",".join(stubs), str(src), str(light), json.dumps(versions)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_child_env())
            if proc.returncode == 0:
                raw: list[dict[str, Any]] = json.loads(proc.stdout)
                log(f"built with stand-ins for: {', '.join(stubs) or 'nothing'}")
                if package == "sglang":
                    ASSERTS[version] = render_asserts(version, src)
                return render(build_table(package, version, raw))
            missing = re.findall(r"No module named '([^'.]+)", proc.stderr)
            if not missing or missing[-1] in stubs:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"building {target.module}.{target.args_class} failed (above)")
            stubs.append(missing[-1])
    raise SystemExit("gave up after 60 stand-ins")


ASSERT_DIR = REPO_ROOT / "operations" / "kb" / "knowledge" / "asserts"
ASSERT_FILES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/*.py")


def start_asserts(src: Path) -> dict[str, list[str]]:
    """The asserts a release's argument checks make at start-up: every `assert` inside
    `_validate_mamba_*` / `validate_mamba_*` / `_handle_*` of server_args.py and arg_groups/,
    by function (leading underscore dropped), each its message (an f-string's holes as {}) or,
    without one, `assert <test>`."""
    found: dict[str, set[str]] = {}
    for pattern in ASSERT_FILES:
        for path in sorted(src.glob(pattern)):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.FunctionDef):
                    continue
                name = node.name.lstrip("_")
                if not (name.startswith("validate_mamba") or node.name.startswith("_handle_")):
                    continue
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Assert):
                        found.setdefault(name, set()).add(_assert_text(sub))
    return {name: sorted(messages) for name, messages in sorted(found.items())}


def _assert_text(node: ast.Assert) -> str:
    msg = node.msg
    if isinstance(msg, ast.Constant):
        return str(msg.value)
    if isinstance(msg, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in msg.values)
    return "assert " + ast.unparse(node.test)


def render_asserts(version: str, src: Path) -> str:
    doc = {
        "package": "sglang",
        "version": version,
        "source": f"sglang=={version} wheel from PyPI: {', '.join(ASSERT_FILES)}",
        "generated_by": f"scripts/gen_cli_table.py sglang {version}",
        "asserts": start_asserts(src),
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SGLANG", "CUDA"))}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0", HF_HUB_OFFLINE="1")
    return env


ASSERTS: dict[str, str] = {}  # version -> its start-up asserts, as written


def generate(package: str, version: str, cache_dir: Path, method: str = "stubbed") -> str:
    if method == "stubbed":
        return generate_stubbed(package, version, cache_dir)
    target = TARGETS[package]
    venv = cache_dir / f"{package}-{version}"
    ensure_venv(venv)
    wheel = download_wheel(venv, target.dist, version)
    pins = exact_pins(wheel)
    marker = venv / ".cli-table-installed"
    if not marker.exists():
        if target.needs:
            install(venv, [requirement(n, pins) for n in target.needs])
        pip(venv, "install", "--no-deps", "--force-reinstall", str(wheel))
        marker.write_text(wheel.name + "\n")
    raw = extract(venv, target, pins)
    return render(build_table(package, version, raw))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("package", choices=sorted(TARGETS))
    ap.add_argument("version", help="exact release, e.g. 0.5.11")
    ap.add_argument("--cache-dir", type=Path, default=None, help="where throwaway venvs live")
    ap.add_argument("--out-dir", type=Path, default=TABLE_DIR)
    ap.add_argument(
        "--method",
        choices=("stubbed", "venv"),
        default="stubbed",
        help="stubbed (default): no torch, the release's wheel (6-37 MiB); venv: CPU torch",
    )
    ap.add_argument(
        "--check", action="store_true", help="do not write; fail if the committed table differs"
    )
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+)?", args.version):
        ap.error(f"not an exact release version: {args.version}")

    try:
        text = generate(
            args.package, args.version, args.cache_dir or default_cache_dir(), args.method
        )
    except subprocess.CalledProcessError as exc:
        log(f"{' '.join(map(str, exc.cmd))[:200]} failed with exit status {exc.returncode}")
        return 1
    out = args.out_dir / f"{args.package}-{args.version}.json"
    written = {out: text}
    if args.version in ASSERTS:
        written[ASSERT_DIR / f"sglang-{args.version}.json"] = ASSERTS[args.version]
    if args.check:
        stale = [p for p, t in written.items() if not p.exists() or p.read_text() != t]
        for path in stale:
            log(f"{path} is missing or differs from the regenerated one")
        if stale:
            return 1
        log(f"{out} is up to date")
        return 0
    for path, content in written.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    n = len(json.loads(text)["options"])
    log(f"wrote {out} ({n} option strings)")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """main() for a user: a failed step is one line naming it, non-zero, never a traceback
    (pip's and the extractor's own output, above it, says the rest)."""
    sys.path.insert(0, str(REPO_ROOT))
    from operations.cli.closed_pipe import quiet

    try:
        return quiet(lambda: main(argv))
    except subprocess.CalledProcessError as exc:
        cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        print(f"gen_cli_table: `{cmd}` failed (exit status {exc.returncode})", file=sys.stderr)
    except OSError as exc:
        print(f"gen_cli_table: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        print(f"gen_cli_table: {exc.code}", file=sys.stderr)
    except KeyboardInterrupt:
        print("gen_cli_table: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(cli())
