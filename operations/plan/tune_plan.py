"""What `python -m operations.tune` does on a host, decided in the plan (docs/how-to/tune.md).

- which rank: the highest-numbered one (`pick_rank`): every rank runs the same unit but for its
  GPU and port, so any one measures the settings; the last leaves rank 0, the first rank the
  router lists and `status` shows, serving;
- which candidates (`candidates`): the current settings first (the baseline, measured the same
  way, its rounds' spread the noise), then each value of knowledge/throughput.yaml `tune.values`
  one lever at a time, then each `tune.together` pair moved as one (the follower takes the
  lead's value: a running batch past the CUDA-graph size decodes without graphs), then the
  `tune.last` levers' values (speculative decoding, as SGLang's own tuner does). A candidate
  that turns a lever on carries its `tune.needs` (speculative: the extra_buffer Mamba
  strategy; max_running_requests kept explicit, tried at each of its values where it is
  unset). Each value is set as a group_data line sets it (settings.with_values: checked and
  typed as a load does), and the candidate is the rank's whole unit, resolved from those
  settings by the resolver, so every flag is checked against the release's real parser as a
  deploy's is; a candidate the settings or the resolver refuse is shown failed with its reason
  and never started. A value equal to the current setting is no candidate;
- each started candidate is asked a chat question once healthy (`smoke`, as a roll's batch is
  before it rejoins, with `smoke_requests`): one that answers wrong is failed, never measured;
- a host a deploy of this inventory would change is refused (deploy first), but for the tune's
  own rank, which a cut-off tune leaves on a candidate's unit: the host program puts it back
  first and refuses to go on when its unit is then not this plan's (`--unit-sha256`);
- the host program's command line (programs/tune.py), but the router and restart steps, which
  the step writes from the DrainPlan as the serve step does (steps/tune.py);
- whether a cut-off tune is resumed: always, unless `--fresh` (the host program finds the cut-off
  run with the same candidates, unit and load in its records, and keeps what it measured);
- the estimate (`--dry`) and the time budget: the program starts no candidate the budget
  cannot finish, and shows it skipped; optional latency bounds (the best throughput within
  them, programs/tune_table.py).

The tune changes no setting: it proposes group_data lines; applying them is a deploy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from operations import layout
from operations.facts.serve import Serving
from operations.kb.throughput import TuneSpace, TuneValue
from operations.plan.planned_files import PlannedFile, planned
from operations.plan.resolver.types import Rank, ResolvedHost
from operations.plan.serve_plan import RollPlan
from operations.plan.smoke_plan import SmokeRequests, smoke_targets
from operations.plan.throughput_plan import load_flags
from operations.render.host_scripts import script_text
from operations.settings import Settings, SettingsError, with_values

# The default time budget of a whole tune: a real rank (a 27B model) takes minutes to start,
# and each candidate starts once; three hours holds the default search on CT200 (15
# candidates: `make demo-tune` estimates about 140 minutes).
DEFAULT_BUDGET_S = 10800
# What one start of a rank is estimated at for `--dry`, where the release's start-up is not
# measured yet: the bound is health_timeout_s (said beside it).
START_ESTIMATE_S = 240
# Where a candidate's values are said to be set (a refusal names it).
TUNED = "the tune's candidate"

TUNE_REFUSAL = (
    "tune: this inventory would restart ranks or the router on this host (not yet deployed: "
    "`python -m operations.plan INVENTORY` shows what); deploy it first (pyinfra INVENTORY "
    "deploy.py), then tune; nothing was changed"
)


@dataclass(frozen=True)
class Candidate:
    """One point of the search: the settings it moves, the rank's unit with them (None: the
    current unit, measured as it serves), the group_data lines that apply it, or why the
    resolver refuses it (then it is never started)."""

    name: str
    changes: dict[str, object]  # each setting as a group_data line sets it (JSON)
    unit: str | None
    lines: list[str]
    refused: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "changes": self.changes,
            "lines": self.lines,
            "refused": self.refused,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class TunePlan:
    rank: int | None = None
    why_rank: str = ""
    candidates: list[Candidate] = field(default_factory=list)
    files: list[PlannedFile] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    budget_s: int = DEFAULT_BUDGET_S
    # The line said before anything starts: behind the router, or out of service.
    service: str = ""
    estimate: str = ""
    errors: list[str] = field(default_factory=list)
    # Each candidate is asked a chat question once healthy, as a roll's batch is before it
    # rejoins (smoke_requests: true): one that answers wrong is failed, never measured.
    smoke: SmokeRequests | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "why_rank": self.why_rank,
            "candidates": [c.to_json() for c in self.candidates],
            "argv": self.argv,
            "budget_s": self.budget_s,
            "service": self.service,
            "estimate": self.estimate,
            "errors": self.errors,
            "smoke": self.smoke.targets if self.smoke is not None else None,
        }


def pick_rank(ranks: Sequence[Rank]) -> tuple[Rank, str]:
    """The rank the tune uses, and why (the docstring)."""
    chosen = max(ranks, key=lambda r: r.rank)
    why = (
        f"rank {chosen.rank} ({chosen.unit_name}): every rank runs the same unit but for its GPU "
        "and port, so any one measures the settings; the highest is taken so rank 0 (the first "
        "the router lists and status shows) keeps serving"
    )
    return chosen, why


Move = dict[str, TuneValue]


def plain(value: TuneValue) -> object:
    """A value as JSON holds it (a read-only mapping as a dict)."""
    return dict(value) if isinstance(value, Mapping) else value


def value_text(value: TuneValue) -> str:
    """A value as a candidate's name shows it: a number as written, false or null as off, a
    speculative mapping as its algorithm and numbers."""
    if isinstance(value, Mapping):
        shown = {"num_steps": "steps", "eagle_topk": "topk", "num_draft_tokens": "draft"}
        rest = " ".join(f"{shown.get(k, k)} {v}" for k, v in value.items() if k != "algorithm")
        return " ".join(x for x in (str(value.get("algorithm")), rest) if x)
    if value is None or value is False:
        return "off"
    return value if isinstance(value, str) else json.dumps(value)


def line(key: str, value: TuneValue) -> str:
    """The group_data line that sets `key` to `value` (YAML: JSON's numbers, false, null and
    mappings are YAML too)."""
    return f"{key}: {json.dumps(plain(value))}"


def _set(s: Settings, move: Move) -> Settings:
    return with_values(s, {k: plain(v) for k, v in move.items()}, TUNED)


def differs(s: Settings, key: str, value: TuneValue) -> bool:
    """Whether setting `key` to `value` changes `s` (a value the settings refuse does: the
    candidate is then shown refused)."""
    try:
        return bool(getattr(_set(s, {key: value}), key) != getattr(s, key))
    except SettingsError:
        return True


def _needs(s: Settings, move: Move, space: TuneSpace) -> list[Move]:
    """`move` with what it needs (the `Need` docstring): one move, or one per value of an
    explicit lever the current settings leave unset."""
    found = [dict(move)]
    for need in space.needs:
        value = move.get(need.lever, False)
        if value is None or value is False:
            continue
        extra = {k: v for k, v in need.sets.items() if k not in move and differs(s, k, v)}
        found = [{**m, **extra} for m in found]
        key = need.explicit
        if key is not None and key not in move and getattr(s, key) is None:
            found = [{**m, key: v} for m in found for v in space.values[key]]
    return found


def candidates(
    s: Settings, rank: int, space: TuneSpace, resolve: Callable[[Settings], ResolvedHost]
) -> list[Candidate]:
    """The search, in order (the docstring); `resolve` is the resolver with this host's facts."""
    last = space.last.levers if space.last is not None else ()

    def one_at_a_time(levers: Collection[str]) -> list[Move]:
        return [
            {lever: v}
            for lever, values in space.values.items()
            if lever in levers
            for v in values
            if differs(s, lever, v)
        ]

    moves = one_at_a_time([k for k in space.values if k not in last])
    for pair in space.together:
        for value in space.values[pair.lead]:
            move: Move = {pair.lead: value, pair.follows: value}
            if any(differs(s, k, v) for k, v in move.items()) and move not in moves:
                moves.append(move)
    moves += one_at_a_time(last)
    found = [Candidate("current", {}, None, [])]
    for move in (m for base in moves for m in _needs(s, base, space)):
        name = " + ".join(f"{k}={value_text(v)}" for k, v in move.items())
        lines = [line(k, v) for k, v in move.items()]
        changes = {k: plain(v) for k, v in move.items()}
        try:
            resolved = resolve(_set(s, move))
        except SettingsError as e:
            why = "; ".join(e.problems)
            found.append(Candidate(name, changes, None, lines, f"refused by the plan: {why}"))
            continue
        unit = next((r.unit for r in resolved.ranks if r.rank == rank), None)
        if resolved.errors or unit is None:
            why = "; ".join(resolved.errors) or f"the resolver gave no rank {rank}"
            found.append(Candidate(name, changes, None, lines, f"refused by the plan: {why}"))
        else:
            found.append(Candidate(name, changes, unit, lines))
    return found


def touched(roll: RollPlan) -> list[Rank]:
    """The ranks a deploy's roll would start, restart or hold (not `unchanged`)."""
    return [*roll.start, *roll.rolled, *roll.held, *roll.start_after, *roll.stopped]


def measure_s(s: Settings) -> float:
    """One measurement's time at most: the ramp's bound and the rounds."""
    return s.throughput_ramp_timeout_s + s.throughput_rounds * s.throughput_window_s


def tune_plan(
    s: Settings,
    ranks: Sequence[Rank],
    serving: Serving,
    touched: Collection[int],
    router_restarts: bool,
    router_here: bool,
    space: TuneSpace,
    resolve: Callable[[Settings], ResolvedHost],
    digests: Mapping[str, str],
    budget_s: int = DEFAULT_BUDGET_S,
    bounds: tuple[float | None, float | None] = (None, None),
    fresh: bool = False,
) -> TunePlan:
    """The tune's decision for this host (see the docstring). `touched`: the ranks a deploy of
    this inventory would (re)start or hold here, `router_restarts`: it would restart the router
    (either refused, TUNE_REFUSAL, but the tune's own rank: a tune cut off there left it on a
    candidate's unit, which the host program puts back first, and refuses the rank's unit when
    it is then not the plan's); `router_here`: a router drains the host's ranks (the
    DrainPlan)."""
    if not ranks:
        return TunePlan(errors=["tune: this host runs no rank (dp_size 0): nothing to tune"])
    if not s.enable_metrics:
        return TunePlan(
            errors=[
                "tune: each candidate is measured by the rank's own counters, and "
                "enable_metrics is false; set enable_metrics: true on the controller, deploy, "
                "then tune"
            ]
        )
    chosen, why = pick_rank(ranks)
    if router_restarts or set(touched) - {chosen.rank}:
        return TunePlan(errors=[TUNE_REFUSAL])
    state = serving.ranks.get(chosen.rank)
    if chosen.rank not in touched and (state is None or state.active != "active"):
        active = state.active if state is not None else "no unit"
        return TunePlan(
            errors=[
                f"tune: {chosen.unit_name} is not serving (systemd: {active}); the tune measures a "
                "serving rank: deploy (pyinfra INVENTORY deploy.py) until it serves, then tune"
            ]
        )
    found = candidates(s, chosen.rank, space, resolve)
    entry = layout.managed_file(s, layout.TUNE_SCRIPT)
    script = planned("Tune | script", entry, script_text("tune.py"), digests)
    starts = sum(1 for c in found if c.unit is not None and not c.refused)
    took = measure_s(s)
    start_s = min(START_ESTIMATE_S, s.health_timeout_s)
    # The current settings are measured once more last (programs/tune_table.AGAIN), on the
    # rank's own unit restarted: one measurement and one start more.
    least = (len([c for c in found if not c.refused]) + (1 if starts else 0)) * took
    likely = least + (starts + (1 if starts else 0)) * start_s
    estimate = (
        f"{len(found)} candidates ({starts} to start, "
        f"{len(found) - 1 - starts} refused by the plan; the current settings measured again "
        f"last); about {likely / 60:.0f} min "
        f"({took:g} s measuring each, about {start_s} s a start, each start at most "
        f"health_timeout_s {s.health_timeout_s} s); budget {budget_s / 60:.0f} min"
    )
    if chosen.rank in touched:
        estimate += (
            f"; {chosen.unit_name}'s unit is not this plan's: a tune cut off there is put back "
            "first, else the tune refuses (deploy first)"
        )
    service = (
        f"{chosen.unit_name} leaves the router for the whole tune and rejoins it on its own unit "
        f"at the end; the other {len(ranks) - 1} rank(s) serve throughout"
        if router_here
        else f"no router drains this host: {chosen.unit_name} is OUT OF SERVICE while it is "
        "measured (its clients' requests to it fail or wait), and back on its own unit at the end"
    )
    argv = ["python3", layout.TUNE_SCRIPT, "--unit", chosen.unit_name]
    argv += ["--unit-path", layout.rank_unit_path(chosen.rank)]
    argv += ["--url", layout.rank_server_url(s, chosen.rank)]
    argv += ["--unit-sha256", hashlib.sha256(chosen.unit.encode()).hexdigest()]
    argv += ["--state", layout.TUNE_STATE, "--results", layout.TUNE_RECORDS]
    argv += ["--budget", str(budget_s), "--start-estimate", str(start_s)]
    argv += ["--key-file", layout.SECRETS_FILE, "--service-user", s.service_user]
    argv += ["--candidates", json.dumps([c.to_json() for c in found], sort_keys=True)]
    argv += load_flags(s)
    argv += ["--fresh"] if fresh else []
    ttft, itl = bounds
    argv += ["--max-ttft-ms", f"{ttft:g}"] if ttft is not None else []
    argv += ["--max-itl-ms", f"{itl:g}"] if itl is not None else []
    if ttft is not None or itl is not None:
        shown = [f"TTFT p50 at most {ttft:g} ms" if ttft is not None else ""]
        shown += [f"ITL p50 at most {itl:g} ms" if itl is not None else ""]
        estimate += f"; the best within {' and '.join(x for x in shown if x)}"
    smoke = (
        SmokeRequests(layout.env_python(chosen.engine_env), smoke_targets(s, [chosen], None, False))
        if s.smoke_requests
        else None
    )
    return TunePlan(
        smoke=smoke,
        rank=chosen.rank,
        why_rank=why,
        candidates=found,
        files=[script],
        argv=argv,
        budget_s=budget_s,
        service=service,
        estimate=estimate,
    )
