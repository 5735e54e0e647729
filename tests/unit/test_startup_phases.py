"""A rank's start read phase by phase from its journal (operations/programs/startup_phases.py),
in each release's words as the knowledge base keeps them (plan/startup.py hands them over)."""

from __future__ import annotations

from operations.plan.startup import startup_patterns
from operations.programs.startup_phases import (
    LINES_BEFORE,
    around,
    compile_patterns,
    read_phases,
    split_line,
    summary,
)

T0 = 1767225600.0


def journal(*entries: tuple[float, str]) -> list[str]:
    """Lines as `journalctl -o short-unix` prints them."""
    return [f"{T0 + t:.6f} ct200 sglang-0[4242]: {text}" for t, text in entries]


# 0.5.10's spelling: sgl-project/sglang#29170 (weights) and model_runner.py:2460 (graphs).
OLD = journal(
    (3.0, "[2026-05-02 09:12:40 TP0] Init torch distributed begin."),
    (5.0, "[2026-05-02 09:12:41 TP0] Load weight begin. avail mem=94.00 GB"),
    (
        9.6,
        "[2026-05-02 09:12:44 TP0] Load weight end. elapsed=4.58 s, type=Qwen3_5ForConditional"
        "Generation, quant=fp8, avail mem=63.12 GB, mem usage=28.51 GB.",
    ),
    (
        10.0,
        "[2026-05-02 09:12:45 TP0] Capture cuda graph begin. This can take up to several "
        "minutes. avail mem=20.00 GB",
    ),
    (
        124.0,
        "[2026-05-02 09:14:38 TP0] Capture cuda graph end. Time elapsed: 114.02 s. mem "
        "usage=1.20 GB. avail mem=20.11 GB.",
    ),
    (125.0, "INFO:     Uvicorn running on http://127.0.0.1:30000"),
    (131.5, "[2026-05-02 09:14:46] The server is fired up and ready to roll!"),
)
# 0.5.23's: cuda_graph_setup.py:788 (one line per graph), model_runner.py:1373.
NEW = journal(
    (2.0, "[2026-12-01 10:00:01 TP0] Init parallel ends. elapsed=2.04 s"),
    (
        8.0,
        "[2026-12-01 10:00:07 TP0] Load weight end. elapsed=5.50 s, type=Qwen3_5ForConditional"
        "Generation, avail mem=40.00 GB, mem usage=50.10 GB.",
    ),
    (
        20.5,
        "[2026-12-01 10:00:20 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4], "
        "elapsed=12.50 s, mem usage=0.93 GB, avail mem=11.02 GB.",
    ),
    (
        23.0,
        "[2026-12-01 10:00:22 TP0] Capture prefill CUDA graph end. elapsed=2.25 s, mem "
        "usage=0.50 GB, avail mem=10.50 GB.",
    ),
    (30.0, "[2026-12-01 10:00:29] The server is fired up and ready to roll!"),
)


def test_the_old_spelling_gives_each_phase() -> None:
    phases, index = read_phases(T0, OLD, compile_patterns(startup_patterns("0.5.10")))
    assert phases["weights_s"] == 4.58 and phases["graphs_s"] == 114.02
    assert phases["graphs"] == 1
    assert phases["healthy_s"] == 131.5 and phases["warmup_s"] == 7.5
    assert phases["last_phase"] == "ready" and index == len(OLD) - 1


def test_the_new_spelling_sums_every_graph() -> None:
    phases, _ = read_phases(T0, NEW, compile_patterns(startup_patterns("0.5.23")))
    assert phases["graphs"] == 2 and phases["graphs_s"] == 14.75
    assert phases["weights_s"] == 5.5 and phases["healthy_s"] == 30.0
    assert phases["warmup_s"] == 7.0
    assert summary(phases) == ("healthy 30.0 s: weights 5.5 s, graphs 14.8 s (2), warm-up 7.0 s")


def test_a_release_reads_only_its_own_words() -> None:
    """0.5.10's graph line is not 0.5.23's: read with the wrong release, no graph is seen."""
    phases, _ = read_phases(T0, OLD, compile_patterns(startup_patterns("0.5.23")))
    assert phases["graphs"] == 0 and phases["graphs_s"] is None


def test_a_start_that_stalls_says_its_last_phase_and_the_lines_around_it() -> None:
    stalled = OLD[:4] + journal(*((11.0 + i, f"noise {i}") for i in range(40)))
    phases, index = read_phases(T0, stalled, compile_patterns(startup_patterns("0.5.10")))
    assert phases["last_phase"] == "graph_capture_begin" and phases["last_at"] == 10.0
    assert phases["healthy_s"] is None
    assert summary(phases).startswith("starting, last phase graph_capture_begin at 10.0 s")
    shown = around(stalled, index)
    assert shown[LINES_BEFORE - 1] == stalled[2] or shown[0] == stalled[0]
    assert stalled[3] in shown and len(shown) <= LINES_BEFORE + 31


def test_a_line_without_a_stamp_is_kept_as_text() -> None:
    assert split_line("no stamp here") == (None, "no stamp here")
    assert split_line(OLD[0])[1].endswith("Init torch distributed begin.")


def test_no_patterns_no_phases() -> None:
    assert compile_patterns("") == {}
    assert startup_patterns("0.4.0") == ""
