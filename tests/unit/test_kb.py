"""The knowledge base loads into typed, frozen objects; every entry cites a known source and
every source is cited; broken data is refused at load time with the key that is broken, rather
than producing a wrong plan."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from operations import kb
from operations.kb import KNOWLEDGE_DIR, KnowledgeError, Source, intake
from operations.kb.raw import RawRelease


def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((KNOWLEDGE_DIR / "sglang.yaml").read_text())
    return data


def entries(value: object) -> Iterator[object]:
    """Every dataclass instance reachable from `value` (the loaded objects, not the YAML)."""
    if isinstance(value, Source):
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield value
        for f in dataclasses.fields(value):
            yield from entries(getattr(value, f.name))
    elif isinstance(value, tuple | list):
        for item in value:
            yield from entries(item)
    elif hasattr(value, "values"):
        for item in value.values():
            yield from entries(item)


METADATA = Path(__file__).resolve().parents[1] / "fixtures" / "metadata"


def cited(value: object) -> tuple[Source, ...]:
    source = getattr(value, "source", ())
    assert isinstance(source, tuple)
    return source


def test_loads_and_every_release_has_its_cli_table() -> None:
    knowledge = kb.load()
    # Every release on PyPI from 0.5.10 (the first that serves Qwen3.6) on, post releases
    # included, has its metadata captured and an entry; a metadata file without one is a gap.
    captured = sorted(
        (p.stem.removeprefix("sglang-") for p in METADATA.glob("sglang-*.txt")), key=kb.version
    )
    assert knowledge.supported_releases() == captured
    for release in knowledge.releases:
        table = knowledge.cli_table("sglang", release)
        assert table is not None and table.version == release
        assert "--model-path" in table.options and "--config" in table.options


@pytest.mark.parametrize(
    ("release", "lanes"),
    [
        ("0.5.9", ["cu128"]),
        ("0.5.11", ["cu128", "cu130"]),
        ("0.5.19", ["cu128", "cu129", "cu130"]),
        ("0.5.23", ["cu130"]),
    ],
)
def test_lanes_by_release(release: str, lanes: list[str]) -> None:
    assert kb.load().releases[release].lanes == lanes


def test_every_entry_cites_a_known_source() -> None:
    knowledge = kb.load()
    citing = [e for e in entries(knowledge) if hasattr(e, "source")]
    # Every kind of entry that cites is reached, so the walk really covers the data.
    kinds = {type(e).__name__ for e in citing}
    assert kinds >= {
        "Gpu", "Lane", "Release", "PackageBuild", "Override", "Unproven", "Architecture",
        "KnownModel", "GpuRule", "HybridBackends", "AutoBackend", "Spelling", "NoBufferRule",
        "Speculative",
    }  # fmt: skip
    for entry in citing:
        sources = cited(entry)
        assert sources, f"{entry} cites nothing"
        for source in sources:
            assert knowledge.sources[source.id] is source
            assert source.url.startswith("https://") and source.what


def test_every_source_is_cited_by_some_entry() -> None:
    knowledge = kb.load()
    used = {s.id for e in entries(knowledge) for s in cited(e)}
    assert used == set(knowledge.sources)


def test_the_loaded_objects_are_frozen() -> None:
    knowledge = kb.load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        knowledge.gpus["12.0"].min_cuda = "11.0"  # type: ignore[misc]
    with pytest.raises(TypeError):
        knowledge.releases["0.5.9"] = knowledge.releases["0.5.11"]  # type: ignore[index]
    table = knowledge.cli_table("sglang", "0.5.11")
    assert table is not None
    with pytest.raises(TypeError):
        table.options["--nope"] = table.options["--port"]  # type: ignore[index]


def test_each_release_has_exactly_one_spelling_of_each_renamed_setting() -> None:
    """What the resolver writes for a renamed setting is an option the release's real parser
    has, and not only as a deprecated alias."""
    knowledge = kb.load()
    for flag in knowledge.flags.all():
        for release in knowledge.releases:
            spelling = flag.spelling(release)
            assert spelling is not None and spelling.option is not None, (flag.setting, release)
            table = knowledge.cli_table("sglang", release)
            option = table.get(spelling.option) if table else None
            assert option is not None and not option.deprecated, (flag.setting, release)


def test_the_gpu_rules_answer_by_release() -> None:
    knowledge = kb.load()
    before, after = (knowledge.backend_rule("trtllm_mha", r) for r in ("0.5.11", "0.5.19"))
    assert before is not None and before.refuses("12.0")
    assert after is not None and not after.refuses("12.0") and after.refuses("8.9")
    fa4 = knowledge.backend_rule("fa4", "0.5.23")
    assert fa4 is not None and fa4.refuses("12.0") and not fa4.refuses("10.0")
    assert knowledge.backend_rule("fa9", "0.5.23") is None


Mutation = Callable[[dict[str, Any]], object]


def _qsa_for_0519(d: dict[str, Any]) -> None:
    d["attention_backends"]["qsa"] = {"source": "sglang-wheel"}
    d["hybrid_attention_backends"][2]["backends"].append("qsa")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["lanes"]["cu128"].update(source="nowhere"), "lanes.cu128: unknown source"),
        (
            lambda d: d["releases"]["0.5.11"]["builds"]["cu130"]["packages"]["torch"].update(
                source=["pytorch-indexes", "nowhere"]
            ),
            "releases.0.5.11.builds.cu130.packages.torch: unknown source 'nowhere'",
        ),
        (
            lambda d: d["sources"].update(orphan={"what": "x", "url": "https://x"}),
            "sources.orphan: cited by nothing",
        ),
        (
            lambda d: d["auto_attention_backend"][0]["prefer"].append("fa9"),
            "auto_attention_backend[0]: unknown backend 'fa9'",
        ),
        (
            lambda d: d["attention_backends"]["fa3"]["runs_on"].append("7.5"),
            "attention_backends.fa3: unknown compute capability '7.5'",
        ),
        (_qsa_for_0519, "hybrid_attention_backends[2]: sglang 0.5.19's --attention-backend has no"),
        (
            lambda d: d["releases"].update({"0.5.99": d["releases"]["0.5.11"]}),
            "releases.0.5.99: no CLI table",
        ),
        (
            lambda d: d["models"]["Qwen/Qwen3.6-27B"].update(architecture="Nope"),
            "models.Qwen/Qwen3.6-27B: unknown architecture 'Nope'",
        ),
        (
            lambda d: d["releases"]["0.5.11"]["builds"]["cu128"]["packages"]["torch"].update(
                version="2.10.0+cu128"
            ),
            "releases.0.5.11: builds.cu128: torch==2.10.0+cu128 does not satisfy torch==2.11.0",
        ),
        (
            lambda d: d["lanes"]["cu128"]["compiler"].update(version="12.9.86"),
            "lanes.cu128.compiler: version 12.9.86 is not CUDA 12.8's compiler",
        ),
        (
            lambda d: d["rank_environment"][0].update(flashinfer="0.6.8 or so"),
            "rank_environment[0].flashinfer: '0.6.8 or so' is not a version range",
        ),
        (
            lambda d: d["flags"]["mamba_cache_strategy"][1].update(option="--mamba-strategy"),
            "flags.mamba_cache_strategy[1]: sglang 0.5.19 has no option --mamba-strategy",
        ),
        (
            lambda d: d["flags"]["cuda_graph_max_bs"][1].update(option="--cuda-graph-max-bs"),
            "flags.cuda_graph_max_bs[1]: sglang 0.5.19 has only a deprecated option",
        ),
        (
            lambda d: d["flags"]["mamba_cache_strategy"][0].update(releases="<0.5.20"),
            "flags.mamba_cache_strategy: sglang 0.5.19 falls in 2 of its ranges",
        ),
        (
            lambda d: d["mamba_no_buffer"][0].update(releases="0.5.9"),
            "mamba_no_buffer[0].releases: '0.5.9' is not a version range",
        ),
        (
            lambda d: d["speculative"].update(hybrid_requires_mamba_strategy="sometimes"),
            "speculative.hybrid_requires_mamba_strategy: sglang 0.5.9 does not accept 'sometimes'",
        ),
        (lambda d: d["lanes"]["cu128"].pop("min_driver"), "'min_driver' is a required property"),
        (
            lambda d: d["gpus"].update({"twelve": d["gpus"]["12.0"]}),
            "gpus: 'twelve' does not match",
        ),
        (
            lambda d: d["attention_backends"]["fa3"].pop("reason"),
            "attention_backends.fa3: 'reason' is a dependency",
        ),
        (
            lambda d: d["flags"].update(page_size=d["flags"]["cuda_graph_max_bs"]),
            "flags: Additional properties are not allowed ('page_size'",
        ),
        (
            lambda d: d["routers"]["1.13.0"].update(package="sgl-model-gateway"),
            "routers.1.13.0.package: 'sgl-model-gateway' is not one of",
        ),
        (
            lambda d: d["routers"]["0.3.2"].pop("launcher"),
            "'launcher' is a required property",
        ),
        (
            lambda d: d["routers"].update({"1.14.0": d["routers"]["1.13.0"]}),
            "routers.1.14.0: no CLI table",
        ),
        (
            lambda d: d["routers"]["1.13.0"]["health"]["options"].update(
                {"--worker-wedge-sec": "3"}
            ),
            "routers.1.13.0: smg 1.13.0 has no option --worker-wedge-sec",
        ),
        (
            lambda d: d["routers"]["0.3.2"].update(
                health={**d["routers"]["1.13.0"]["health"], "options": {"--worker-stall-secs": "2"}}
            ),
            "routers.0.3.2: sglang-router 0.3.2 has no option --worker-stall-secs",
        ),
        (
            lambda d: d["routers"]["1.13.0"]["drain"].update(state="removing"),
            "routers.1.13.0.drain.state: 'removing' is not one of its worker_states",
        ),
        (
            lambda d: d["routers"]["1.13.0"]["drain"].update(source="nowhere"),
            "routers.1.13.0.drain: unknown source 'nowhere'",
        ),
        (
            lambda d: d["routers"]["1.13.0"]["engines"]["tested"].append("0.5.99"),
            "routers.1.13.0.engines.tested: '0.5.99' is not a release of `releases`",
        ),
        (
            lambda d: d["routers"]["1.13.0"]["engines"].update(unproven="0.5.18 to 0.5.23"),
            "routers.1.13.0.engines.unproven: '0.5.18 to 0.5.23' is not a version range",
        ),
    ],
)
def test_broken_knowledge_is_refused_naming_the_key(mutate: Mutation, message: str) -> None:
    data = raw()
    mutate(data)
    with pytest.raises(KnowledgeError) as caught:
        kb.build(data)
    assert message in str(caught.value)


def test_every_problem_is_named_at_once() -> None:
    data = raw()
    data["lanes"]["cu128"]["source"] = "nowhere"
    data["models"]["Qwen/Qwen3.6-27B"]["architecture"] = "Nope"
    with pytest.raises(KnowledgeError) as caught:
        kb.build(data)
    assert "lanes.cu128: unknown source" in str(caught.value)
    assert "models.Qwen/Qwen3.6-27B: unknown architecture" in str(caught.value)


def test_the_unchanged_data_builds_into_what_the_yaml_says() -> None:
    """The values below are read off knowledge/sglang.yaml by eye, not computed by kb.py."""
    built = kb.build(raw())

    assert built.supported_releases()[:4] == ["0.5.9", "0.5.10", "0.5.10.post1", "0.5.11"]
    release = built.releases["0.5.11"]
    assert (release.glibc, release.python.versions) == ("2.34", ("3.11", "3.12"))
    assert release.requires == (
        "torch==2.11.0",
        "torchvision",
        "torchaudio==2.11.0",
        "sglang-kernel==0.4.2",
        "flashinfer_python==0.6.8.post1",
        "cuda-python>=13.0",
    )
    cu128 = next(b for b in release.builds if b.lane.name == "cu128")
    assert [(p.name, p.version, p.index, p.index_lane) for p in cu128.packages] == [
        ("torch", "2.11.0+cu128", "torch", "cu128"),
        ("torchvision", "0.26.0+cu128", "torch", "cu128"),
        ("torchaudio", "2.11.0+cu128", "torch", "cu128"),
        ("sglang-kernel", "0.4.2+cu129", "kernel", "cu129"),
    ]
    assert [o.requirement for o in cu128.overrides] == ["cuda-python==12.9.4"]
    lane = built.lanes["cu128"]
    assert (lane.cuda, lane.min_driver, lane.toolkit_driver) == ("12.8", "525", "570")
    assert lane.compiler is not None
    assert (lane.compiler.version, lane.compiler.origin) == ("12.8.93", "nvidia-redist")
    gpu = built.gpus["12.0"]
    assert (gpu.arch, gpu.min_cuda) == ("sm_120", "12.8")
    assert [s.id for s in gpu.source] == ["nvidia-cuda-release-notes"]
    model = built.models["Qwen/Qwen3.6-27B"]
    assert (model.architecture.name, model.min_release, model.size_gb) == (
        "Qwen3_5ForConditionalGeneration",
        "0.5.10",
        54,
    )
    assert model.architecture is built.architectures["Qwen3_5ForConditionalGeneration"]
    assert model.architecture.hybrid_linear_attention
    fa3 = built.backend_rule("fa3", "0.5.11")
    assert fa3 is not None and fa3.runs_on == ("8.0", "8.6", "8.9", "9.0")
    auto = built.auto_rule("12.0")
    assert auto is not None and auto.prefer == ("flashinfer", "triton")
    spelling = built.flags.mamba_cache_strategy.spelling("0.5.11")
    assert spelling is not None and spelling.option == "--mamba-scheduler-strategy"


def test_the_router_releases_build_into_what_the_yaml_says() -> None:
    """Read off knowledge/sglang.yaml's `routers` by eye: sglang-router 0.3.2 and smg 1.13.0,
    both installing an `smg` command (so never in one environment)."""
    built = kb.build(raw())
    old, new = built.routers["0.3.2"], built.routers["1.13.0"]
    assert (old.package, old.launcher, old.commands) == (
        "sglang-router",
        "sglang_router.launch_router",
        ("amg", "sglang-router", "smg"),
    )
    assert (old.drain, old.control_plane, old.engines) == (None, None, None)
    assert (new.package, new.launcher, new.commands) == ("smg", "smg.launch_router", ("smg",))
    assert set(old.commands) & set(new.commands) == {"smg"}
    assert (new.list_workers, new.remove_worker, new.add_worker, new.update_worker) == (
        "GET /workers",
        "DELETE /workers/{id}",
        "POST /workers",
        "PATCH /workers/{id}",
    )
    assert new.worker_states == ("pending", "ready", "not_ready", "failed", "draining")
    assert new.duplicate_add_status == 409
    assert new.drain is not None
    assert (new.drain.state, new.drain.settle_secs, new.drain.waits_for_in_flight) == (
        "draining",
        5,
        False,
    )
    plane = new.control_plane
    assert plane is not None
    assert (plane.key_format, plane.missing_key_status, plane.from_option) == (
        "id:name:role:key",
        401,
        "--control-plane-api-keys",
    )
    assert plane.no_environment
    assert new.health is not None
    assert new.health.options["--worker-wedge-secs"] == "3"
    assert new.health.options["--worker-stall-secs"] == "2"
    assert new.rank_metrics is not None and new.rank_metrics.prefix == "sglang:"
    assert new.engines is not None
    assert new.engines.tested == ("0.5.10", "0.5.12.post1", "0.5.16", "0.5.17")
    assert [r for r in built.supported_releases() if kb.in_range(r, new.engines.unproven)] == [
        "0.5.18",
        "0.5.19",
        "0.5.20",
        "0.5.21",
        "0.5.22",
        "0.5.23",
    ]
    assert {s.id for s in new.drain.source} == {"smg-1.13.0", "smg-1.13.0-capture", "smg-job-queue"}
    assert (new.drain.settle_update, new.drain.settle_applied) == (
        "PATCH /workers/{id}",
        "GET /workers/{id}",
    )


def test_a_cli_table_whose_header_names_another_release_is_refused(tmp_path: Path) -> None:
    text = (kb.CLI_DIR / "sglang-0.5.11.json").read_text()
    (tmp_path / "sglang-0.5.12.json").write_text(text)
    with pytest.raises(KnowledgeError) as caught:
        kb.load_cli_table("sglang", "0.5.12", tmp_path)
    assert "sglang-0.5.12.json: its header says sglang 0.5.11" in str(caught.value)


ASSERTS = kb.KNOWLEDGE_DIR / "asserts"


@pytest.mark.parametrize("release", kb.load().supported_releases())
def test_every_start_assert_a_release_makes_is_anticipated_or_unreachable(release: str) -> None:
    """Each assert of the release's `_validate_mamba_*` / `_handle_*` (read from its wheel into
    knowledge/asserts/) is covered by a `start_asserts` entry: the plan adds the flag or refuses,
    or no setting reaches it. This is the check that would have caught no_buffer's overlap
    schedule (0.5.14+)."""
    knowledge = kb.load()
    table = json.loads((ASSERTS / f"sglang-{release}.json").read_text())
    assert table["version"] == release
    uncovered = [
        f"{function}: {message}"
        for function, messages in table["asserts"].items()
        for message in messages
        if not any(rule.covers(function, message) for rule in knowledge.start_asserts)
    ]
    assert not uncovered, uncovered


def test_every_start_assert_entry_covers_something() -> None:
    """An entry no release's assert matches is stale data."""
    knowledge = kb.load()
    seen = [
        (function, message)
        for path in ASSERTS.glob("sglang-*.json")
        for function, messages in json.loads(path.read_text())["asserts"].items()
        for message in messages
    ]
    for rule in knowledge.start_asserts:
        assert any(rule.covers(f, m) for f, m in seen), rule


def test_the_no_buffer_overlap_assert_is_anticipated_by_the_rule_that_adds_the_flag() -> None:
    """Remove `adds` from the no_buffer rules and the releases asserting it stand uncovered by
    the plan: the rule and its assert entry agree."""
    knowledge = kb.load()
    for path in sorted(ASSERTS.glob("sglang-*.json")):
        table = json.loads(path.read_text())
        asserts_overlap = any(
            "overlap schedule" in m for m in table["asserts"].get("validate_mamba_no_buffer", [])
        )
        rule = knowledge.no_buffer_rule(table["version"])
        assert rule is not None
        assert ("--disable-overlap-schedule" in rule.adds) == asserts_overlap, table["version"]


def _committed(release: str) -> RawRelease:
    entry: RawRelease = raw()["releases"][release]
    return entry


@pytest.mark.parametrize("release", kb.load().supported_releases())
def test_intake_derives_each_committed_entry_offline(release: str) -> None:
    """`python -m operations.kb --check` from the committed fixtures alone: every entry is what
    the intake derives, but for a lane a person added beyond the draft."""
    metadata = intake.metadata_path(release).read_text()
    committed = _committed(release)
    drafted = intake.draft(release, metadata, committed["glibc"])
    problems = intake.differences(committed, drafted.entry)
    assert all(p.endswith(": committed, not derived") for p in problems), problems


def test_intake_check_passes_for_three_entries_and_fails_on_a_changed_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from operations.cli import kb as cli

    releases = kb.load().supported_releases()
    passing = [r for r in releases if cli.main(["--check", r]) == 0]
    assert len(passing) >= 3, passing
    changed = copy.deepcopy(_committed(passing[-1]))
    changed["builds"]["cu130"]["packages"]["torch"]["version"] = "0.0.0+cu130"
    monkeypatch.setattr(cli, "committed_entry", lambda release: changed)
    assert cli.main(["--check", passing[-1]]) == 1
    assert "builds.cu130.packages: committed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["--check", "0.5.x"], "is not a release number"),
        (["--check", "9.9.9"], "no captured METADATA"),
    ],
)
def test_intake_bad_input_is_one_line(
    argv: list[str], wanted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from operations.cli import kb as cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert wanted in err and len(err.strip().splitlines()) == 1, err
