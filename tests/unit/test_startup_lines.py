"""The start-up lines of each release (operations/kb/knowledge/startup/sglang-<v>.json, written by
scripts/gen_startup_lines.py from the release's wheel): every regex parses its own format string
filled with sample values, and real log lines in each release's words give their seconds."""

from __future__ import annotations

import re

import pytest

from operations import kb
from operations.kb.startup import (
    PHASES,
    STARTUP_DIR,
    StartupLines,
    load_startup,
    startup_problems,
)
from tests.scripts import script_module

RELEASES = sorted(p.stem.removeprefix("sglang-") for p in STARTUP_DIR.glob("sglang-*.json"))

# One sample value per hole, in order: distinct, so a regex that takes the wrong hole for the
# duration is caught.
_HOLE = re.compile(
    r"\{(?:[^{}]|\{[^{}]*\})*\}|%(?:\([a-z_]+\))?[-+ #0]*[0-9*]*(?:\.[0-9*]+)?[diouxXeEfFgGcrsa]"
)


def _filled(fmt: str, style: str) -> tuple[str, list[str]]:
    """The format with hole i replaced by f"{i+1}.{i+1}7" (a float), "CUDA graph" for the graph
    kind (what SGLang's graph_backend table gives on CUDA) or else "w i" (text with a space);
    the values in order."""
    values: list[str] = []

    def one(m: re.Match[str]) -> str:
        hole = m.group()
        i = len(values)
        if hole.endswith(("f}", "f")):
            value = f"{i + 1}.{i + 1}7"
        elif hole.startswith("{graph_backend["):
            value = "CUDA graph"
        else:
            value = f"w {i}"
        values.append(value)
        return value

    text = fmt if style == "percent" else fmt.replace("{{", "\0").replace("}}", "\1")
    filled = _HOLE.sub(one, text) if style != "plain" else text
    return filled.replace("\0", "{").replace("\1", "}"), values


def test_every_release_of_the_knowledge_base_has_its_startup_lines() -> None:
    assert set(RELEASES) == set(kb.load().releases)
    assert startup_problems(kb.load()) == []


@pytest.mark.parametrize("release", RELEASES)
def test_each_regex_parses_its_format_filled(release: str) -> None:
    lines = load_startup(release)
    assert isinstance(lines, StartupLines)
    for phase, entries in lines.phases.items():
        for entry in entries:
            filled, values = _filled(entry.format, entry.style)
            line = f"[2026-12-01 10:00:00 TP0] {filled}"
            m = entry.regex.search(line)
            assert m is not None, (release, phase, entry.format)
            if entry.timed:
                seconds = m["seconds"]
                assert seconds in values, (release, phase, seconds)
                before = filled[: filled.index(seconds)]
                assert before.endswith(("elapsed=", "Time elapsed: ", "capture in ")), before
                assert lines.seconds(phase, line) == float(seconds)


# Real lines in each spelling: sgl-project/sglang#29170 (0.5.10-era spelling of the weight
# line) and the formats as the wheels write them for a CUDA device.
REAL = [
    (
        "0.5.10",
        "[2026-05-02 09:12:44 TP0] Load weight end. elapsed=4.58 s, type=Qwen3_5ForConditional"
        "Generation, quant=fp8, avail mem=63.12 GB, mem usage=28.51 GB.",
        "weight_load_end",
        4.58,
    ),
    (
        "0.5.10",
        "[2026-05-02 09:14:38 TP0] Capture cuda graph end. Time elapsed: 114.02 s. mem usage="
        "1.20 GB. avail mem=20.11 GB.",
        "graph_capture_end",
        114.02,
    ),
    (
        "0.5.23",
        "[2026-12-01 10:01:02 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8], "
        "elapsed=12.50 s, mem usage=0.93 GB, avail mem=11.02 GB.",
        "graph_capture_end",
        12.5,
    ),
    (
        "0.5.23",
        "[2026-12-01 10:00:40 TP0] Load weight end. Committed real weights after CUDA graph "
        "capture in 3.25 s (capture overlap window 9.00 s, startup overlap total 12.25 s)",
        "weight_load_end",
        3.25,
    ),
    (
        "0.5.23",
        "[2026-12-01 10:00:01 TP0] Init parallel ends. elapsed=2.04 s",
        "parallel_init_end",
        2.04,
    ),
]


@pytest.mark.parametrize(("release", "line", "phase", "seconds"), REAL)
def test_real_lines_give_their_seconds(release: str, line: str, phase: str, seconds: float) -> None:
    lines = load_startup(release)
    assert lines is not None
    assert lines.phase_of(line) == phase
    assert lines.seconds(phase, line) == seconds


def test_the_graph_line_names_its_graph() -> None:
    lines = load_startup("0.5.23")
    assert lines is not None
    line = (
        "Capture target decode CUDA graph end. bs=[1, 2], elapsed=1.00 s, "
        "mem usage=0.1 GB, avail mem=1.0 GB."
    )
    m = next(
        e.regex.search(line) for e in lines.phases["graph_capture_end"] if e.regex.search(line)
    )
    assert m is not None
    assert (m["name"], m["backend"]) == ("target decode", "CUDA graph")


def test_the_ready_line_is_the_same_in_every_release() -> None:
    for release in RELEASES:
        lines = load_startup(release)
        assert lines is not None
        assert lines.phase_of("[x] The server is fired up and ready to roll!") == "ready"


def test_phases_are_the_generators() -> None:
    assert tuple(script_module("gen_startup_lines").PHASES) == PHASES


def test_the_generator_reads_a_format_and_its_regex_from_source(tmp_path: object) -> None:
    gen = script_module("gen_startup_lines")
    import ast

    call = ast.parse(
        'logger.info(f"Load weight end. elapsed={time.perf_counter() - t:.2f} s, '
        'avail mem={m:.2f} GB.")'
    ).body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    arg = gen._message_arg(call.value)
    parts, style = gen._parts(*arg)
    msg = gen.Message("x.py", 1, parts, style)
    assert (
        msg.format
        == "Load weight end. elapsed={time.perf_counter() - t:.2f} s, avail mem={m:.2f} GB."
    )
    m = re.search(gen.regex(msg), "Load weight end. elapsed=7.25 s, avail mem=1.00 GB.")
    assert m is not None and m["seconds"] == "7.25"
