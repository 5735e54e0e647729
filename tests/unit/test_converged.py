"""A converged host reports no change, in every configuration (issue 29): the real
`pyinfra -y INVENTORY deploy.py` runs twice over pyinfra's @fake connector against a host that
remembers what the first run wrote (tests/unit/simulated_host.py). The second run must send the
host no command but the plan's facts' and write no file.

The simulated host reads a managed file back only when the ServingState fact's own command asks
for it, as the real `sha256sum` does: a file some step writes that the fact does not checksum is
rewritten on every run (the drain script behind a router was, issue 29).
"""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.facts.model import script_module
from operations.settings import defaults
from operations.simulated import ct200 as simulated_ct200
from operations.steps.serve import restart_command
from tests.unit.builders import make_settings
from tests.unit.simulated_host import RUNNER, asked_paths

pytestmark = pytest.mark.integration  # runs pyinfra and the plan command

ROOT = Path(__file__).resolve().parents[2]
SLUG = "Qwen--Qwen3.6-27B"
FAKE = '{"fake_delay": 0, "fake_delay_jitter": 0}'
# The facts a deploy's plan asks (operations/runtime/gather.py), and FileAt for a secret, whose
# mode and owners are read on every run (operations/steps/host_files.py).
PLAN_FACTS = {"PreflightFacts", "ServingState", "ModelStaging", "CanaryState"}

CONFIGURATIONS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "plain": (["ct200"], {}),
    "router on the same host": (["ct200"], {"router": {"host": "@fake/ct200", "port": 8000}}),
    "router on another host": (
        ["ct200", "ct201"],
        {"router": {"host": "@fake/ct201", "port": 8000, "control_plane_key_file": "CPKEY"}},
    ),
    "api key": (["ct200"], {"api_key_file": "KEYFILE"}),
    "api key behind a router": (
        ["ct200"],
        {"api_key_file": "KEYFILE", "router": {"host": "@fake/ct200", "port": 8000}},
    ),
    "hub source": (["ct200"], {"model_source": "hf://Qwen/Qwen3.6-27B@" + "a" * 40}),
    "controller source": (["ct200"], {"model_source": "controller:MODELDIR"}),
    "sudo": (["ct200"], {"_sudo": True}),
    "two hosts": (["ct200", "ct201"], {}),
}


def inventory(tmp_path: Path, names: list[str], data: dict[str, Any]) -> Path:
    key = tmp_path / "api-key"
    key.write_text("sk-converged\n")
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text((simulated_ct200.CAPTURED / "model-config.json").read_text())
    # A real model's tokenizer: preflight refuses a source without one while the throughput
    # check is on (programs/tokenizer_files.py).
    (model / "tokenizer.json").write_text("{}\n")
    # The engine's lock on the controller: a converged controller has it (engine_spec.lock_path).
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    data = {"engine_lock_dir": str(locks), **data}
    # The router's control-plane key, shared by the hosts behind it (router.control_plane_key_file).
    control = tmp_path / "control-plane.key"
    control.write_text("cp-key-converged-0123456789abcdef\n")
    text = json.dumps(data).replace("KEYFILE", str(key)).replace("MODELDIR", str(model))
    text = text.replace("CPKEY", str(control))
    path = tmp_path / "inventory.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import json
            from tests.doubles.ct200 import fake_responses
            DATA = json.loads({text!r})
            hosts = [
                (f"@fake/{{name}}", {{"fake_responses": fake_responses(), **{FAKE}, **DATA}})
                for name in {names!r}
            ]
            """
        )
    )
    return path


def run(tmp_path: Path, image: Path, what: str, *args: str) -> tuple[str, list[list[Any]]]:
    log = tmp_path / "commands.json"
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(image), str(log), what, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    assert result.returncode == 0, out
    return out, json.loads(log.read_text())


def source_answer(data: dict[str, Any], inv: Path) -> tuple[str, str | None]:
    """The ModelStaging fact's source digest and hub revision on a host that has the source:
    a controller source's digest is its scan on the controller (the sync compares the two)."""
    source = str(data.get("model_source", ""))
    if source.startswith("controller:"):
        return str(script_module().scan(str(inv.parent / "model"))["digest"]), None
    if source.startswith("hf://"):
        return "52cd26977905ef55", source.rpartition("@")[2]
    return "52cd26977905ef55", None


def seed(tmp_path: Path, inv: Path, names: list[str], data: dict[str, Any]) -> Path:
    """The image of hosts whose engine and staged copy are the plan's (what the engine and model
    steps leave; their own convergence is tested by their own plans), nothing served yet."""
    image = tmp_path / "image.json"
    image.write_text(json.dumps({f"@fake/{n}": {"files": {}, "engine": {}} for n in names}))
    out, _ = run(tmp_path, image, "plan", str(inv), "--json")
    doc = json.loads(out[out.index("{") :])
    images = {}
    digest, revision = source_answer(data, inv)
    for name, host in doc["hosts"].items():
        assert host["errors"] == [], host["errors"]
        engine = host["engine"]
        (Path(doc_locks(inv)) / f"{engine['name']}.lock").write_text("# lock\n")
        home = host["ranks"][0]["env"]["CUDA_HOME"]
        release, lane = engine["name"].split("-")[:2]
        images[name] = {
            "files": {},
            "units": {},
            "slug": SLUG,
            "key": host["model_key"],
            "engine": {
                "name": engine["name"],
                "release": release,
                "lane": lane,
                "uv": defaults()["uv_version"],
                "toolkits": [home.rsplit("/", 1)[-1]],
            },
            "staging": {
                "digest": digest,
                "bytes": 53_800_000_000,
                "files": 19,
                "models": f"{defaults()['model_stage_dir']}/models",
                "hub_revision": revision,
            },
        }
    image.write_text(json.dumps(images))
    return image


def doc_locks(inv: Path) -> Path:
    return inv.parent / "locks"


def read_data(inv: Path) -> dict[str, Any]:
    """The inventory's data as the test wrote it (json in the file)."""
    text = inv.read_text()
    start = text.index("json.loads(") + len("json.loads(")
    return dict(json.loads(ast.literal_eval(text[start : text.index(")", start)])))


def operations_commands(seen: list[list[Any]]) -> list[str]:
    return [f"{host}: {cmd}" for host, fact, cmd in seen if fact is None]


@pytest.mark.parametrize("configuration", list(CONFIGURATIONS))
def test_a_converged_host_reports_no_change(tmp_path: Path, configuration: str) -> None:
    names, data = CONFIGURATIONS[configuration]
    inv = inventory(tmp_path, names, data)
    image = seed(tmp_path, inv, names, data)

    first, seen = run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")
    assert operations_commands(seen), first  # the first run served: it wrote units
    settings = make_settings(**{k: v for k, v in read_data(inv).items() if not k.startswith("_")})
    registry = {f.path: f for f in layout.managed_files(settings)}
    for name in names:
        written = json.loads(image.read_text())[f"@fake/{name}"]["files"]
        assert layout.unit_path(layout.unit_name(0)) in written, first
        # The last step recorded the toolkit version (read back by the second run's fact).
        assert layout.TOOLKIT_RECORD in written, first
        # The allow-list: every file a step wrote is in the registry (the rank units too).
        unlisted = [p for p in written if p not in registry]
        assert unlisted == [], f"written but not in layout.managed_files: {unlisted}"
    # Every checksummed entry is read back by the fact, under its own path.
    facts = [cmd for _, fact, cmd in seen if fact == "ServingState"]
    for command in facts:
        assert set(asked_paths(command)) == set(layout.checksummed_paths(settings)), command

    second, seen = run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")

    assert operations_commands(seen) == [], second
    asked = {fact for _, fact, _ in seen}
    secret = {"FileAt"} if "api_key_file" in data else set()
    assert asked <= PLAN_FACTS | secret, asked
    assert "No changes" in second or "Changed: 0" in second or "changed" not in second.lower()


def test_a_rank_a_killed_drain_left_out_of_the_router_is_put_back(tmp_path: Path) -> None:
    """Issue 31: a deploy killed after `router_workers out` took rank 3 out and after its
    restart (or with no restart at all), before `in`: its unit is the plan's, its process runs
    it, and the router does not list it. The next run puts it back (no restart), the one after
    changes nothing. Before, it stayed out for good."""
    names, data = CONFIGURATIONS["router on the same host"]
    inv = inventory(tmp_path, names, data)
    image = seed(tmp_path, inv, names, data)
    run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")
    images = json.loads(image.read_text())
    listed = images["@fake/ct200"]["listed"]
    assert len(listed) == 8, listed
    left_out = next(url for url in listed if url.endswith(":30003"))
    listed.remove(left_out)
    image.write_text(json.dumps(images))

    out, seen = run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")

    assert "put rank(s) 3 back into the router" in out, out
    changes = operations_commands(seen)
    assert len(changes) == 1 and " in sglang@3.service=" in changes[0], changes
    assert left_out in json.loads(image.read_text())["@fake/ct200"]["listed"]
    again, seen = run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")
    assert operations_commands(seen) == [], again


def test_a_roll_behind_a_router_is_one_host_command_per_batch(tmp_path: Path) -> None:
    """Issue 31: each batch is drained, written, restarted (systemd reloaded while it stops),
    health-gated, asked and put back by one host command (programs/roll_batch.py), in that order;
    the host then holds the new units and lists every rank, and the run after changes
    nothing."""
    names, data = CONFIGURATIONS["router on the same host"]
    inv = inventory(tmp_path, names, data)
    image = seed(tmp_path, inv, names, data)
    run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")
    before = json.loads(image.read_text())["@fake/ct200"]["units"]
    # A roll, not the canary a serving host gets by default (tests/unit/test_canary_plan.py).
    rolling = {"mem_fraction_static": 0.85, "rollout": {"strategy": "rolling"}}
    inv = inventory(tmp_path, names, {**data, **rolling})

    out, seen = run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")

    batches = [c for c in operations_commands(seen) if f"{layout.ROLL_BATCH_SCRIPT} --batch" in c]
    assert len(batches) == 8, out
    for rank, command in enumerate(batches):
        steps = json.loads(shlex.split(command.split(": ", 1)[1])[-1])
        order = [name for name, _, _ in steps]
        assert order == ["drain", "write", "restart", "health", "smoke", "readmit"]
        named = {name: shlex.join(argv) for name, argv, _ in steps}
        assert f"out sglang@{rank}.service=" in named["drain"], named
        shell = {name: argv[-1] for name, argv, _ in steps}  # /bin/sh -c TEXT
        assert f'mv -f "$tmp" {layout.unit_path(layout.unit_name(rank))}' in shell["write"]
        assert shell["restart"] == restart_command(f"sglang@{rank}.service")
        assert f"in sglang@{rank}.service=" in named["readmit"], named
    host = json.loads(image.read_text())["@fake/ct200"]
    assert all(host["units"][u] != before[u] for u in before), "every unit rolled"
    assert len(host["listed"]) == 8, host["listed"]
    again, seen = run(tmp_path, image, "pyinfra", "-y", str(inv), "deploy.py")
    assert operations_commands(seen) == [], again
