"""How often the tune proposes the right settings, on this noisy 2-core machine (issue 50).

Not a speed ratio: a decision's error rate, counted over repeated trials whose right answer is
known. Each trial draws the SGLang server double's speed at random (its decode rate, what a
larger batch costs a step, how much slower a batch past the CUDA-graph size decodes: the
double's knobs, tests/doubles/packages/sglang/_generate_double.py), so nobody knows the best
candidate in advance, and runs the bundled tune program (programs/tune.py) as the host runs it,
at the defaults (3 windows; windows of 2 s to keep a trial short), on one rank of the double
whose "unit" is its command line: the restart step restarts the double on it. The candidates are
the knowledge base's for the e2e test's current settings (32 running, a graph size of 32) over
the levers this double is given (the running cap, the graph size, the memory fraction and the
scheduler's conservativeness, with a KV cache of a random number of requests).

The right answer is the double's own capacity for each candidate, from its scheduler's step
time (Gen.step_s: a batch of the running cap, decoded as fast as the double decodes it, with no
CPU of its own): a proposal is right when its true capacity is within the noise the tune
stated of the true best's. A candidate past the double's memory limit never starts: it must be
shown failed.

    python bench/tune_bench.py [TRIALS]   (default 5)
    python bench/tune_bench.py restart UNIT PIDFILE PORT KNOBS   (the restart step)

Prints each trial's knobs, the tune's table and verdict, and the counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operations.render.host_scripts import script_text  # noqa: E402
from tests.doubles.rank_doubles import engine_env, free_port, scheduler_module  # noqa: E402

KEY = "sk-bench-tune"
LOAD = [
    "--input-len", "8", "--output-len", "32", "--start", "8", "--most", "512",
    "--ramp-timeout", "60", "--rounds", "3", "--window", "2", "--timeout", "240", "--model", "m",
]  # fmt: skip
# The e2e test's current settings; the scheduler's conservativeness at the release's 1.0.
CURRENT = {
    "max_running_requests": 32,
    "cuda_graph_max_bs": 32,
    "mem_fraction_static": 0.9,
    "schedule_conservativeness": 1.0,
}
FLAGS = {
    "max_running_requests": "--max-running-requests",
    "cuda_graph_max_bs": "--cuda-graph-max-bs",
    "mem_fraction_static": "--mem-fraction-static",
    "schedule_conservativeness": "--schedule-conservativeness",
}
MEM_LIMIT = 0.93
READY_S = 60


def truth(settings: dict[str, float], knobs: dict[str, str]) -> float | None:
    """The double's output tokens/s at saturation with `settings` (None: it cannot start)."""
    if settings["mem_fraction_static"] > MEM_LIMIT:
        return None
    gen_module = scheduler_module("generate_double_for_bench")
    saved = dict(os.environ)
    os.environ.update(knobs)
    try:
        gen = gen_module.Gen(
            int(settings["max_running_requests"]),
            int(settings["cuda_graph_max_bs"]),
            settings["schedule_conservativeness"],
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    running = int(gen.max_running)
    return running / float(gen.step_s(running))


def candidates() -> list[dict[str, object]]:
    """The plan's own search (tune_plan.candidates) for CURRENT on the simulated CT200, less
    the candidates that move a lever this bench's double is not given; each candidate's unit
    the double's settings."""
    from operations import kb
    from operations.plan import resolver
    from operations.plan.tune_plan import candidates as planned
    from tests.unit.builders import facts, make_settings

    s = make_settings(**CURRENT)
    knowledge = kb.load()
    found = planned(
        s, 7, kb.load_throughput().tune, lambda t: resolver.resolve(t, facts(), knowledge)
    )
    kept = [c for c in found if set(c.changes) <= set(CURRENT) and not c.refused]
    return [
        {
            **c.to_json(),
            "unit": None
            if c.unit is None
            else json.dumps({**CURRENT, **c.changes}, sort_keys=True) + "\n",
        }
        for c in kept
    ]


def restart(unit: str, pidfile: str, port: str, knobs_file: str) -> int:
    """The restart step: the double stopped by its pid, started on `unit`'s settings, ready."""
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        pid = int(Path(pidfile).read_text())
        os.kill(pid, signal.SIGTERM)
        for _ in range(300):  # its serve loop sees SIGTERM within 0.5 s
            os.kill(pid, 0)
            time.sleep(0.05)
    settings = json.loads(Path(unit).read_text())
    knobs = json.loads(Path(knobs_file).read_text())
    env = Path(knobs.pop("_env"))
    model = knobs.pop("_model")
    words = [str(env / "bin" / "python"), "-m", "sglang.launch_server"]
    words += ["--model-path", model, "--served-model-name", "m", "--host", "127.0.0.1"]
    words += ["--port", port, "--enable-metrics", "--api-key", KEY]
    for key, flag in FLAGS.items():
        words += [flag, f"{settings[key]:g}"]
    log = Path(pidfile).with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            words,
            env={
                "PATH": os.environ["PATH"],
                "CUDA_VISIBLE_DEVICES": "0",
                "SGLANG_DOUBLE_LOAD_SECONDS": "0",
                **knobs,
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    Path(pidfile).write_text(str(proc.pid))
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(log.read_text().strip().splitlines()[-1:], flush=True)
            return 1
        if "ready: serving" in log.read_text():
            return 0
        time.sleep(0.1)
    return 1


def trial(work: Path, env: Path, n: int) -> tuple[bool, bool, str]:
    """One tune on a double of freshly drawn speed: (proposal right, failed shown, said)."""
    draw = random.SystemRandom()
    knobs = {
        "SGLANG_DOUBLE_TOKENS_PER_S": f"{draw.uniform(8, 14):.2f}",
        "SGLANG_DOUBLE_BATCH_COST": f"{draw.uniform(0.01, 0.04):.3f}",
        "SGLANG_DOUBLE_EAGER_COST": f"{draw.uniform(1.5, 3.0):.2f}",
        "SGLANG_DOUBLE_MEM_LIMIT": str(MEM_LIMIT),
        # The KV cache's room, in requests (over the conservativeness): it may cap a larger
        # running cap, so that several candidates tie or a smaller one is as good.
        "SGLANG_DOUBLE_KV_REQUESTS": str(draw.randint(40, 160)),
    }
    here = work / f"trial{n}"
    here.mkdir()
    (here / "knobs.json").write_text(
        json.dumps({**knobs, "_env": str(env), "_model": str(work / "model")})
    )
    unit = here / "unit"
    unit.write_text(json.dumps(CURRENT, sort_keys=True) + "\n")
    port, pidfile = str(free_port()), here / "double.pid"
    step = [sys.executable, str(Path(__file__).resolve()), "restart"]
    step += [str(unit), str(pidfile), port, str(here / "knobs.json")]
    restart_steps = [["restart", ["/bin/sh", "-c", " ".join(step)], []]]
    if restart(*step[3:]) != 0:
        return False, False, "the double did not start"
    program = here / "tune.py"
    program.write_text(script_text("tune.py"))
    found = candidates()
    words = [sys.executable, str(program), "--unit", "bench-rank", "--unit-path", str(unit)]
    words += ["--url", f"http://127.0.0.1:{port}"]
    words += ["--unit-sha256", hashlib.sha256(unit.read_bytes()).hexdigest()]
    words += ["--state", str(here / "tune.state"), "--results", str(here / "tune.jsonl")]
    words += ["--budget", "3600", "--start-estimate", "5", "--key-file", str(work / "secrets")]
    words += ["--service-user", os.environ.get("USER") or "root"]
    words += ["--candidates", json.dumps(found), "--restart", json.dumps(restart_steps), *LOAD]
    try:
        out = subprocess.run(words, capture_output=True, text=True, timeout=3600).stdout
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
    if not (here / "tune.jsonl").exists():
        return False, False, f"trial {n}: the tune measured nothing: {out.strip()[-2000:]}"
    records = [json.loads(x) for x in (here / "tune.jsonl").read_text().splitlines()]
    rows = {r["name"]: r for r in records if "name" in r}
    (summary,) = [r for r in records if "summary" in r]
    settings = {c["name"]: {**CURRENT, **json.loads(str(c["unit"] or "{}"))} for c in found}
    true = {name: truth(s, knobs) for name, s in settings.items()}
    best = max(v for v in true.values() if v is not None)
    proposed = str(summary.get("best") or "current")
    noise = float(summary.get("noise") or 0)
    right = (true[proposed] or 0) >= best * (1 - noise)
    failed_shown = all(rows[name]["status"] == "failed" for name, v in true.items() if v is None)
    table = [x for x in out.splitlines() if not x.startswith(("tune: [", "roll batch"))]
    said = "\n".join(
        [
            f"trial {n}: the double {knobs}",
            *table,
            "true capacity: "
            + ", ".join(f"{k} {'-' if v is None else f'{v:.0f}'}" for k, v in true.items()),
            f"proposed {proposed}: true {true[proposed] or 0:.0f} tok/s, best {best:.0f}, "
            f"stated noise {noise:.1%}: {'RIGHT' if right else 'WRONG'}",
        ]
    )
    return right, failed_shown, said


def main(trials: int) -> int:
    work = Path(tempfile.mkdtemp(prefix="tune-bench-"))
    env = engine_env(work / "engine")
    (work / "model").mkdir()
    (work / "model" / "tokenizer.json").write_text("{}")
    (work / "secrets").write_text(f'api-key: "{KEY}"\n')
    counts: list[tuple[bool, bool]] = []
    for n in range(1, trials + 1):
        began = time.monotonic()
        right, shown, said = trial(work, env, n)
        counts.append((right, shown))
        print(f"{said}\n(trial {n}: {time.monotonic() - began:.0f} s)\n", flush=True)
    print(f"proposal within its stated noise of the true best: {sum(r for r, _ in counts)} of "
          f"{trials}; a candidate that cannot start shown failed: {sum(s for _, s in counts)} "
          f"of {trials}")  # fmt: skip
    return 0 if all(r and s for r, s in counts) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["restart"]:
        sys.exit(restart(*sys.argv[2:6]))
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
