"""How a rank's start is watched: the release's start-up lines as the host programs read them
(operations/programs/startup_phases.py), and how long a start may stay silent."""

from __future__ import annotations

import json

from operations.kb.startup import load_startup

# A start that writes nothing to its journal for this long fails the health wait by name, with
# its last phase: SGLang's own bounds on a silent step are 600 s (SGLANG_WARMUP_TIMEOUT, the
# warm-up request) and 300 s (--watchdog-timeout's default, a batch without progress).
RANK_SILENCE_S = 600


def startup_patterns(release: str) -> str:
    """The release's phase regexes as JSON (phase -> [regex]); "" when it has none."""
    lines = load_startup(release)
    if lines is None:
        return ""
    return json.dumps(
        {phase: [e.regex.pattern for e in entries] for phase, entries in lines.phases.items()},
        sort_keys=True,
    )
