"""What the SGLang server double logs as it starts: one line per phase in the release's own words
(operations/kb/knowledge/startup/sglang-<v>.json, the formats read from the release's wheel by
scripts/gen_startup_lines.py), each format's holes filled with sample values and the phase's own
duration left as `{seconds}` for the double to fill. Embedded in the double's wheel as
sglang/_startup_lines.json (tests/doubles/wheels.py sglang_wheel)."""

from __future__ import annotations

import json
import re
from typing import cast

from operations.kb.startup import Phase, PhaseLine, load_startup

# A format's holes: f-string fields (one level of nested braces) and %-style conversions.
_HOLE = re.compile(
    r"\{(?:[^{}]|\{[^{}]*\})*\}|%(?:\([a-z_]+\))?[-+ #0]*[0-9*]*(?:\.[0-9*]+)?[diouxXeEfFgGcrsa]"
)
SECONDS = "{seconds}"
# The phases the double logs, in order (no line marks the warm-up's start: SGLang warms up
# between the last capture line and the ready line).
LOGGED = (
    "parallel_init_end",
    "weight_load_begin",
    "weight_load_end",
    "graph_capture_begin",
    "graph_capture_end",
    "ready",
)


def _filled(entry: PhaseLine) -> str:
    values: list[str] = []

    def one(m: re.Match[str]) -> str:
        hole, i = m.group(), len(values)
        if hole.endswith(("f}", "f")):
            value = f"{i + 1}.{i + 1}7"
        elif hole.startswith("{graph_backend["):
            value = "CUDA graph"  # SGLang's graph_backend table on CUDA
        elif "quant_str" in hole:
            value = ""  # an unquantised model: no `quant=...,` part
        elif "type(self.model)" in hole:
            value = "Qwen3_5ForConditionalGeneration"
        elif "name" in hole:
            value = "decode"
        else:
            value = f"x{i}"
        values.append(value)
        return value

    fmt = entry.format
    if entry.style == "plain":
        return fmt
    text = fmt if entry.style == "percent" else fmt.replace("{{", "\0").replace("}}", "\1")
    filled = _HOLE.sub(one, text).replace("\0", "{").replace("\1", "}")
    m = entry.regex.search(filled)
    assert m is not None, (entry.format, filled)
    if entry.timed:
        start, end = m.span("seconds")
        filled = filled[:start] + SECONDS + filled[end:]
    return filled


def sample_lines(release: str) -> dict[str, str]:
    """Phase -> the line the double logs for it (its first format in the release's file)."""
    lines = load_startup(release)
    assert lines is not None, f"sglang {release} has no start-up lines in the knowledge base"
    found = {}
    for phase in LOGGED:
        entries = lines.phases.get(cast(Phase, phase), ())
        if not entries:
            continue
        entry = entries[0]
        text = _filled(entry)
        assert entry.regex.search(text.replace(SECONDS, "1.50")), (release, phase, text)
        found[phase] = text
    return found


def startup_json(release: str) -> bytes:
    return json.dumps(sample_lines(release), indent=1, sort_keys=True).encode()
