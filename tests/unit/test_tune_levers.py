"""The tune's levers beyond the running cap and the graph size (issue 50): the prefill chunk, the
scheduler's conservativeness and speculative decoding on and off, each a value of its setting as
a group_data line writes it (checked by the settings' own schema, in the knowledge base and in
the plan), speculative searched last and carrying what it needs; each candidate's lines load
back through the settings loader into the settings it was resolved from; the server double's
speed moved by each, in shape."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType, ModuleType

import pytest
import yaml

from operations import kb as kbmod
from operations.kb import types as kbtypes
from operations.kb.cli_tables import CliTable, load_cli_table
from operations.kb.throughput import Need, TuneSpace, _tune_problems, load_throughput
from operations.plan import resolver
from operations.plan.resolver.types import ResolvedHost
from operations.plan.tune_plan import TUNED, Candidate, candidates
from operations.settings import Layer, Settings, load, with_values
from tests.doubles.rank_doubles import scheduler_module
from tests.unit.builders import BASE, facts, make_settings

MTP = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


def _resolve(s: Settings) -> ResolvedHost:
    return resolver.resolve(s, facts(), kbmod.load())


def _names(found: list[Candidate]) -> list[str]:
    return [c.name for c in found]


# -- the knowledge ----------------------------------------------------------------------------


def test_the_knowledge_searches_each_lever_the_issue_names_speculative_last_with_sources() -> None:
    space = load_throughput().tune
    assert space.values["chunked_prefill_size"] == (4096, 16384)
    assert space.values["schedule_conservativeness"] == (0.5, 1.3)
    off, on = space.values["speculative"]
    assert off is False and dict(on) == MTP  # type: ignore[arg-type]
    assert space.last is not None and space.last.levers == ("speculative",)
    assert {s.id for s in space.last.source} == {"sglang-auto-benchmark-0511"}
    sets = next(n for n in space.needs if n.sets)
    assert dict(sets.sets) == {"mamba_cache_strategy": "extra_buffer"}
    assert {s.id for s in sets.source} == {"sglang-spec-hybrid-0511"}
    explicit = next(n for n in space.needs if n.explicit)
    assert explicit.explicit == "max_running_requests"
    assert "sglang-spec-cap-0511" in {s.id for s in explicit.source}
    lever = load_throughput().lever("schedule_conservativeness")
    assert {s.id for s in lever.source} == {
        "sglang-conservativeness-0511",
        "sglang-hyperparameter-tuning",
    }


def test_a_tune_value_its_setting_refuses_is_named_with_what_is_accepted() -> None:
    raw = {
        "values": {
            "max_running_requests": [64.5],
            "schedule_conservativeness": [-1],
            "speculative": [False, {"algorithm": "EAGLE", "steps": 3}],
            "chunked_prefill_size": [],
        },
        "together": [],
        "needs": [
            {
                "lever": "speculative",
                "sets": {"mamba_cache_strategy": "big"},
                "why": "",
                "source": [],
            },
            {"lever": "speculative", "explicit": "cuda_graph_max_bs", "why": "", "source": []},
        ],
        "last": {"levers": ["fp8_checkpoint"], "why": "", "source": []},
    }
    problems = list(_tune_problems(raw))  # type: ignore[arg-type]
    expected = [
        "tune.values.max_running_requests[0]: 64.5; accepted: null or a positive integer",
        "tune.values.schedule_conservativeness[0]: -1; accepted: null or a number from 0",
        "tune.values.speculative[1]: {'algorithm': 'EAGLE', 'steps': 3}; accepted: false, or a",
        "tune.values.chunked_prefill_size: []; accepted: a list of its values",
        "tune.needs[0].sets.mamba_cache_strategy: 'big'; accepted:",
        "tune.needs[1].explicit: 'cuda_graph_max_bs' has no tune.values",
        "tune.last.levers: 'fp8_checkpoint' has no tune.values",
    ]
    for said in expected:
        assert any(said in p for p in problems), (said, problems)
    assert all("\n" not in p and p.startswith("throughput.yaml tune.") for p in problems)


# -- the plan ---------------------------------------------------------------------------------


def test_the_search_is_each_lever_then_the_pairs_then_speculative_carrying_the_running_cap() -> (
    None
):
    found = candidates(make_settings(), 1, load_throughput().tune, _resolve)
    names = _names(found)
    assert names[:1] == ["current"]
    pairs = names.index("max_running_requests=64 + cuda_graph_max_bs=64")
    assert names.index("chunked_prefill_size=4096") < pairs
    assert names.index("schedule_conservativeness=1.3") < pairs
    # Speculative last; unset, max_running_requests is tried at each of its values (else 48).
    assert names[-2:] == [
        "speculative=EAGLE steps 3 topk 1 draft 4 + max_running_requests=64",
        "speculative=EAGLE steps 3 topk 1 draft 4 + max_running_requests=128",
    ]
    assert not [n for n in names if n == "speculative=off"]  # off is the current setting
    assert all(not c.refused for c in found), [c.refused for c in found if c.refused]
    spec = found[-1]
    assert spec.unit is not None and "--speculative-algorithm EAGLE" in spec.unit
    assert "--max-running-requests 128" in spec.unit
    conservative = next(c for c in found if c.name == "schedule_conservativeness=0.5")
    assert conservative.unit is not None and "--schedule-conservativeness 0.5" in conservative.unit
    chunk = next(c for c in found if c.name == "chunked_prefill_size=16384")
    assert chunk.unit is not None and "--chunked-prefill-size 16384" in chunk.unit


def test_a_running_cap_already_set_is_kept_and_speculative_on_is_tried_off() -> None:
    kept = candidates(make_settings(max_running_requests=96), 1, load_throughput().tune, _resolve)
    assert _names(kept)[-1] == "speculative=EAGLE steps 3 topk 1 draft 4"
    assert kept[-1].unit is not None and "--max-running-requests 96" in kept[-1].unit
    on = make_settings(speculative=MTP, max_running_requests=96)
    found = candidates(on, 1, load_throughput().tune, _resolve)
    assert _names(found)[-1] == "speculative=off"
    assert found[-1].lines == ["speculative: false"]
    assert found[-1].unit is not None and "--speculative-algorithm" not in found[-1].unit


def test_speculative_carries_the_mamba_strategy_a_hybrid_model_needs_else_it_is_refused() -> None:
    s = make_settings(mamba_cache_strategy="no_buffer", max_running_requests=96)
    space = load_throughput().tune
    carried = candidates(s, 1, space, _resolve)[-1]
    assert carried.name == (
        "speculative=EAGLE steps 3 topk 1 draft 4 + mamba_cache_strategy=extra_buffer"
    )
    assert carried.lines[-1] == 'mamba_cache_strategy: "extra_buffer"'
    assert not carried.refused and carried.unit is not None and "extra_buffer" in carried.unit
    # Without the knowledge's need the resolver refuses it, with the knowledge base's reason.
    bare = dataclasses.replace(space, needs=())
    refused = candidates(s, 1, bare, _resolve)[-1]
    assert refused.unit is None and refused.refused.startswith("refused by the plan: ")
    assert "accepted with speculative: extra_buffer" in refused.refused
    assert f"({TUNED})" not in refused.refused  # mamba_cache_strategy is the inventory's


def test_a_release_whose_parser_lacks_a_flag_refuses_the_candidate_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = load_cli_table

    def without(package: str, release: str) -> CliTable | None:
        table = real(package, release)
        if table is None or package != "sglang":
            return table
        options = {k: v for k, v in table.options.items() if k != "--schedule-conservativeness"}
        return dataclasses.replace(table, options=options)

    monkeypatch.setattr(kbtypes, "load_cli_table", without)
    space = TuneSpace(values={"schedule_conservativeness": (0.5,)}, together=())
    found = candidates(make_settings(), 1, space, _resolve)
    assert found[1].unit is None
    assert "has no option --schedule-conservativeness" in found[1].refused
    assert "\n" not in found[1].refused


def test_a_value_the_settings_refuse_is_a_refused_candidate_naming_the_key() -> None:
    space = TuneSpace(values={"schedule_conservativeness": (-1,)}, together=())
    found = candidates(make_settings(), 1, space, _resolve)
    assert found[1].unit is None
    assert "schedule_conservativeness = -1 (set in the tune's candidate)" in found[1].refused


def test_a_need_already_met_adds_nothing() -> None:
    space = TuneSpace(
        values={"speculative": (MappingProxyType(MTP),)},
        together=(),
        needs=(
            Need(
                "speculative",
                MappingProxyType({"mamba_cache_strategy": "extra_buffer"}),
                None,
                "",
                (),
            ),
        ),
    )
    found = candidates(make_settings(max_running_requests=64), 1, space, _resolve)
    assert _names(found) == ["current", "speculative=EAGLE steps 3 topk 1 draft 4"]


def test_every_candidate_s_lines_load_back_into_the_settings_it_was_resolved_from() -> None:
    for base in ({}, {"speculative": MTP, "max_running_requests": 96}):
        s = make_settings(**base)
        for c in candidates(s, 1, load_throughput().tune, _resolve)[1:]:
            data = yaml.safe_load("\n".join(c.lines))
            assert data == c.changes, c.name
            loaded = load("ct200", [Layer("group_data", data), Layer("test", {**BASE, **base})])
            tuned = with_values(s, c.changes, TUNED)
            for key in data:
                assert getattr(loaded, key) == getattr(tuned, key), (c.name, key)
            assert _resolve(loaded).ranks[1].unit == c.unit, c.name


# -- the server double ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen_module() -> ModuleType:
    return scheduler_module("generate_double_for_levers")


def test_the_double_admits_more_at_a_lower_conservativeness_under_its_kv_limit(
    gen_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert gen_module.Gen(max_running=128, conservativeness=0.5).max_running == 128  # no limit
    monkeypatch.setenv(gen_module.KV_REQUESTS_ENV, "60")
    assert gen_module.Gen(max_running=128).max_running == 60
    assert gen_module.Gen(max_running=128, conservativeness=0.5).max_running == 120
    assert gen_module.Gen(max_running=128, conservativeness=1.3).max_running == 46
    assert gen_module.Gen(max_running=32, conservativeness=0.5).max_running == 32


def test_the_double_prefills_a_long_prompt_in_chunks_each_a_stall(
    gen_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert gen_module.Gen().prefill_s(20000) == 0.0  # off by default
    monkeypatch.setenv(gen_module.CHUNK_S_ENV, "0.1")
    assert gen_module.Gen().prefill_s(20000) == pytest.approx(0.3)  # 8192 a chunk: 3
    assert gen_module.Gen(chunk=4096).prefill_s(20000) == pytest.approx(0.5)
    assert gen_module.Gen(chunk=16384).prefill_s(1000) == pytest.approx(0.1)
    assert gen_module.Gen(chunk=-1).prefill_s(20000) == pytest.approx(0.1)


def test_the_double_s_speculative_decoding_speeds_one_stream_not_a_full_batch_and_caps_at_48(
    gen_module: ModuleType,
) -> None:
    plain, spec = gen_module.Gen(), gen_module.Gen(speculative=True)
    assert spec.max_running == gen_module.SPEC_CAP == 48
    assert gen_module.Gen(max_running=96, speculative=True).max_running == 96
    assert (plain.accept, spec.accept) == (1, 2)

    def rate(gen: ModuleType, batch: int) -> float:
        return float(batch * gen.accept / gen.step_s(batch))

    assert rate(spec, 1) > 1.8 * rate(plain, 1)
    assert rate(spec, 64) < 1.0 * rate(plain, 64)
