"""Whether each rank (and the router) answers a chat request as a client sees it: the shipped
smoke script (operations/programs/smoke.py) run on the host by an engine environment's python.

Only `python -m operations.status --probe` reads this fact: it sends requests, so plain status
stays read-only. The deploy runs the same script as an operation (operations/steps/smoke.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

from operations import layout


@dataclass(frozen=True)
class ProbeAnswer:
    """One target's verdict (operations/programs/smoke.py Verdict)."""

    answered: bool
    latency_s: float | None = None
    tokens: int | None = None
    why: str | None = None


@dataclass(frozen=True)
class Probe:
    # Target name (rank number as text, or "router") -> its verdict.
    answers: dict[str, ProbeAnswer] = field(default_factory=dict)
    # Why nothing was asked (no engine environment, no script); None when the script ran.
    error: str | None = None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def parse_probe(lines: list[str]) -> Probe:
    answers: dict[str, ProbeAnswer] = {}
    error = None
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "smoke_unavailable":
            error = rest.strip() or "the smoke script could not run"
        elif word == "smoke":
            try:
                data = json.loads(rest)
            except ValueError:
                continue
            if not isinstance(data, dict) or not isinstance(data.get("target"), str):
                continue
            tokens = data.get("tokens")
            why = data.get("why")
            answers[data["target"]] = ProbeAnswer(
                answered=data.get("answered") is True,
                latency_s=_number(data.get("latency_s")),
                tokens=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
                why=why if isinstance(why, str) else None,
            )
    if not answers and error is None and lines:
        error = " ".join(line.strip() for line in lines if line.strip())[-300:]
    return Probe(answers, error)


class SmokeProbe(FactBase[Probe]):
    """
    Returns each target's answer to GET /v1/models and one POST /v1/chat/completions with the
    served model name and the API key from the host's secrets file (never on a command line),
    asking the deploy's question ("What is A + B?", new numbers each request): a reply without
    the right sum is not answered, its `why` naming the question and the answer.
    A target whose listener is not the service user's, or whose unit is not active, is asked
    nothing: its verdict names the port and the owner.

    .. code:: python

        Probe(answers={"0": ProbeAnswer(answered=True, latency_s=0.04, tokens=12, why=None),
                       "router": ProbeAnswer(answered=False, why="... HTTP 502 ...")},
              error=None)

    + python: the engine environment's interpreter (it has httpx, through openai)
    + model: the served model name
    + targets: name -> OpenAI base URL as the host reaches it
    + timeout_s: each request's timeout
    + service_user: only its listeners, of active units, are asked (and sent the key)
    + units: target name -> its systemd unit (a stopped rank's unit is not active: not asked)
    + router_workers: UNIT=URL of this host's ranks the router forwards the key to
    """

    def command(
        self,
        python: str,
        model: str,
        targets: dict[str, str],
        timeout_s: float,
        service_user: str,
        units: dict[str, str],
        router_workers: list[str] | None = None,
    ) -> StringCommand:
        checks: list[str | QuoteString] = ["--service-user", QuoteString(service_user)]
        for name, unit in sorted(units.items()):
            checks += ["--unit", QuoteString(f"{name}={unit}")]
        for worker in router_workers or []:
            checks += ["--router-worker", QuoteString(worker)]
        words: list[str | QuoteString] = [
            "if [ -x",
            QuoteString(python),
            "] && [ -f",
            QuoteString(layout.SMOKE_SCRIPT),
            "]; then",
            QuoteString(python),
            QuoteString(layout.SMOKE_SCRIPT),
            "--json --model",
            QuoteString(model),
            "--timeout",
            str(timeout_s),
            "--key-file",
            QuoteString(layout.SECRETS_FILE),
            *checks,
            *(QuoteString(f"{name}={url}") for name, url in sorted(targets.items())),
            '2>&1; else echo "smoke_unavailable no engine environment or smoke script on the',
            'host (run the deploy)"; fi; true',
        ]
        return StringCommand(*words)

    @staticmethod
    def default() -> Probe:
        return Probe(error="not probed")

    def process(self, output: list[str]) -> Probe:
        return parse_probe(output)
