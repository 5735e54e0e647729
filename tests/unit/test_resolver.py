"""The resolver across releases, GPUs, lanes and settings: what each rank runs, or why not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from operations import kb as kbmod
from operations.facts.host import Model
from operations.plan.resolver import ResolvedHost, resolve
from operations.render.units import exec_word as systemd_quote
from tests.unit.builders import facts, make_settings

RELEASES = kbmod.load().supported_releases()


def plan(scenario: str = "rtx-pro-6000-x8", **settings: Any) -> ResolvedHost:
    return resolve(make_settings(**settings), facts(scenario))


def options(p: ResolvedHost) -> list[str]:
    assert p.ranks, p.errors
    return p.ranks[0].argv[3:]


def value_of(p: ResolvedHost, option: str) -> str:
    argv = options(p)
    return argv[argv.index(option) + 1]


# (case, fixture, settings, {option: value or None for a bare flag}, absent options)
GOOD: list[tuple[str, str, dict[str, Any], dict[str, str | None], list[str]]] = [
    (
        "default: 0.5.11 cu128 on RTX PRO 6000",
        "rtx-pro-6000-x8",
        {},
        {
            "--attention-backend": "flashinfer",
            "--mamba-scheduler-strategy": "extra_buffer",
            "--mem-fraction-static": "0.9",
            "--served-model-name": "Qwen/Qwen3.6-27B",
            "--model-path": "/dev/shm/models/Qwen--Qwen3.6-27B",
            "--host": "127.0.0.1",
            "--enable-metrics": None,
        },
        ["--mamba-radix-cache-strategy", "--speculative-algorithm", "--config"],
    ),
    (
        "0.5.9 serves Qwen3.5 with triton on sm_120",
        "rtx-pro-6000-x8",
        {"sglang_version": "0.5.9", "model_name": "Qwen/Qwen3.5-27B"},
        {"--attention-backend": "triton", "--mamba-scheduler-strategy": "extra_buffer"},
        [],
    ),
    (
        "0.5.19 keeps a CUDA 12 lane and uses the new Mamba spelling",
        "rtx-pro-6000-x8",
        {"sglang_version": "0.5.19"},
        {"--attention-backend": "flashinfer", "--mamba-radix-cache-strategy": "extra_buffer"},
        ["--mamba-scheduler-strategy"],
    ),
    (
        "0.5.23 on a CUDA 13 driver uses the renamed Mamba flag",
        "rtx-pro-6000-x8-driver-580",
        {"sglang_version": "0.5.23", "cuda_lane": "cu130"},
        {"--attention-backend": "flashinfer", "--mamba-radix-cache-strategy": "extra_buffer"},
        ["--mamba-scheduler-strategy"],
    ),
    (
        "explicit triton is kept",
        "rtx-pro-6000-x8",
        {"attention_backend": "triton"},
        {"--attention-backend": "triton"},
        [],
    ),
    (
        "MTP on 0.5.11: flashinfer too old, auto falls back to triton",
        "rtx-pro-6000-x8",
        {
            "speculative": {
                "algorithm": "EAGLE",
                "num_steps": 3,
                "eagle_topk": 1,
                "num_draft_tokens": 4,
            }
        },
        {
            "--attention-backend": "triton",
            "--speculative-algorithm": "EAGLE",
            "--speculative-num-steps": "3",
            "--speculative-eagle-topk": "1",
            "--speculative-num-draft-tokens": "4",
        },
        [],
    ),
    (
        "MTP on 0.5.19: its flashinfer is new enough",
        "rtx-pro-6000-x8",
        {"sglang_version": "0.5.19", "speculative": {"algorithm": "EAGLE"}},
        {"--attention-backend": "flashinfer", "--speculative-algorithm": "EAGLE"},
        ["--speculative-num-steps"],
    ),
    (
        "CUDA graph batch size, old spelling",
        "rtx-pro-6000-x8",
        {"cuda_graph_max_bs": 256},
        {"--cuda-graph-max-bs": "256"},
        ["--cuda-graph-max-bs-decode"],
    ),
    (
        "CUDA graph batch size, new spelling",
        "rtx-pro-6000-x8-driver-580",
        {"sglang_version": "0.5.23", "cuda_lane": "cu130", "cuda_graph_max_bs": 256},
        {"--cuda-graph-max-bs-decode": "256"},
        ["--cuda-graph-max-bs"],
    ),
    (
        "Hopper: fa3 cannot serve the hybrid model, auto picks flashinfer",
        "h200-x8",
        {"gpu_compute_cap": "9.0"},
        {"--attention-backend": "flashinfer"},
        [],
    ),
    (
        "banner says CUDA N/A: the driver version decides",
        "cuda-na",
        {},
        {"--attention-backend": "flashinfer"},
        [],
    ),
    (
        "API key by file: the key never reaches the command line",
        "rtx-pro-6000-x8",
        {"api_key_file": "secrets/api-key"},
        {"--config": "/etc/sglang/secrets.yaml"},
        ["--api-key"],
    ),
    (
        "metrics off",
        "rtx-pro-6000-x8",
        {"enable_metrics": False, "server_host": "10.0.0.5", "mem_fraction_static": 0.85},
        {"--host": "10.0.0.5", "--mem-fraction-static": "0.85"},
        ["--enable-metrics"],
    ),
    (
        "extra args checked and passed through",
        "rtx-pro-6000-x8",
        {"extra_server_args": ["--kv-cache-dtype", "fp8_e4m3", "--chunked-prefill-size", "2048"]},
        {"--kv-cache-dtype": "fp8_e4m3", "--chunked-prefill-size": "2048"},
        [],
    ),
]


@pytest.mark.parametrize(
    ("case", "scenario", "settings", "want", "absent"), GOOD, ids=[g[0] for g in GOOD]
)
def test_resolves(
    case: str,
    scenario: str,
    settings: dict[str, Any],
    want: dict[str, str | None],
    absent: list[str],
) -> None:
    p = plan(scenario, **settings)
    assert not p.errors, p.errors
    argv = options(p)
    for option, value in want.items():
        assert option in argv, (option, argv)
        if value is not None:
            assert value_of(p, option) == value
    for option in absent:
        assert option not in argv


def test_default_plan_has_eight_ranks_one_per_gpu_and_port() -> None:
    p = plan()
    assert [r.rank for r in p.ranks] == list(range(8))
    assert [r.port for r in p.ranks] == list(range(30000, 30008))
    for r in p.ranks:
        assert r.env["CUDA_VISIBLE_DEVICES"] == str(r.rank)
        # Its own environment, by name: never the `current` link a later switch moves.
        assert r.argv[0] == f"/opt/sglang/envs/{p.engine.name}/bin/python" if p.engine else False
        assert r.argv[1:3] == ["-m", "sglang.launch_server"]
        assert r.engine_env == f"/opt/sglang/envs/{p.engine.name}" if p.engine else False
        assert value_of_rank(r.argv, "--port") == str(r.port)
        assert r.unit_name == f"sglang@{r.rank}.service"
        assert f'Environment="CUDA_VISIBLE_DEVICES={r.rank}"\n' in r.unit
        assert f"DeviceAllow=/dev/nvidia{r.rank} rw\n" in r.unit
        assert f"--port {r.port}" in r.unit
        assert "User=sglang" in r.unit


def value_of_rank(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def test_dp_size_smaller_than_gpus() -> None:
    p = plan(dp_size=4)
    assert [r.gpu for r in p.ranks] == [0, 1, 2, 3]


def test_auto_choice_explains_itself() -> None:
    p = plan(sglang_version="0.5.9", model_name="Qwen/Qwen3.5-27B")
    (decision,) = [d for d in p.decisions if d.what == "attention backend"]
    assert decision.value == "triton"
    assert "flashinfer" in decision.why and "assert" in decision.why


def test_plan_without_host_facts_uses_settings() -> None:
    p = resolve(make_settings())
    assert not p.errors and len(p.ranks) == 8


# (case, fixture, settings, every error of the plan, in order)
REFUSED: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (
        "0.5.23 has no CUDA 12 lane and a 570 driver cannot run CUDA 13",
        "rtx-pro-6000-x8",
        {"sglang_version": "0.5.23"},
        [
            (
                "cuda_lane 'cu128' (set in default): sglang 0.5.23 has no cu128 (CUDA 12.8) "
                "lane; it offers cu130, and this host's driver 570.172.08 cannot run them "
                "(cu130 needs driver >= 580): pin a release that has a cu128 lane or upgrade "
                "the host driver (source: https://pypi.org/project/sglang/; "
                "https://pypi.org/simple/sglang/)"
            ),
        ],
    ),
    (
        "cu130 lane on a 570 driver",
        "rtx-pro-6000-x8",
        {"sglang_version": "0.5.11", "cuda_lane": "cu130"},
        [
            (
                "cuda_lane 'cu130' (set in test): the host's driver 570.172.08 cannot run CUDA "
                "13.0 (needs driver >= 580) (source: "
                "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/)"
            ),
            (
                "cuda_lane 'cu130' (set in test): nvidia-smi reports CUDA Version 12.8; the "
                "lane's CUDA 13.0 needs a CUDA 13 driver (source: "
                "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/)"
            ),
        ],
    ),
    (
        "driver 565 (CUDA 12.7) is too old for sm_120",
        "driver-565",
        {},
        [
            (
                "gpu_compute_cap '12.0': the host's driver 565.57.01 runs CUDA 12.7, but "
                "sm_120 (Blackwell workstation (RTX PRO 6000, RTX 50xx)) needs CUDA >= 12.8: "
                "upgrade the host driver (the 570 branch, >= 570, is the first for CUDA 12.8) "
                "(source: https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/; "
                "https://docs.nvidia.com/deploy/cuda-compatibility/)"
            ),
        ],
    ),
    (
        "sm_121 needs CUDA 12.9: a 570 driver (CUDA 12.8) is told the 575 branch",
        "rtx-pro-6000-x8",
        {"gpu_compute_cap": "12.1"},
        [
            (
                "gpu_compute_cap '12.1': the host's driver 570.172.08 runs CUDA 12.8, but "
                "sm_121 (GB10 (DGX Spark)) needs CUDA >= 12.9: upgrade the host driver (the "
                "575 branch, >= 575, is the first for CUDA 12.9) (source: "
                "https://developer.nvidia.com/cuda-gpus; "
                "https://docs.nvidia.com/deploy/cuda-compatibility/; "
                "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/)"
            ),
            (
                "cuda_lane 'cu128' (set in default): sm_121 (GB10 (DGX Spark)) needs CUDA >= "
                "12.9; the lane's builds are CUDA 12.8: pin a newer lane (source: "
                "https://developer.nvidia.com/cuda-gpus)"
            ),
        ],
    ),
    (
        "0.5.8 is unknown and does not serve the model",
        "rtx-pro-6000-x8",
        {"sglang_version": "0.5.8"},
        [
            (
                "sglang_version '0.5.8' (set in test) is not in the knowledge base (known: "
                f"{len(RELEASES)} releases, {RELEASES[0]} to {RELEASES[-1]}; which fit this "
                "host: '.venv/bin/python -m operations.releases INVENTORY'); to add it, run "
                "'.venv/bin/python -m operations.kb intake 0.5.8' (see "
                "docs/how-to/add-a-release.md)"
            ),
            (
                "sglang_version '0.5.8' (set in test) does not serve "
                "Qwen3_5ForConditionalGeneration (Qwen/Qwen3.6-27B): first served by sglang "
                "0.5.9 (source: https://github.com/sgl-project/sglang/pull/18489)"
            ),
        ],
    ),
    (
        "Qwen3.6 needs 0.5.10",
        "rtx-pro-6000-x8",
        {"sglang_version": "0.5.9"},
        [
            (
                "sglang_version '0.5.9' (set in test) cannot serve Qwen/Qwen3.6-27B: it needs "
                "sglang >= 0.5.10 (source: https://docs.sglang.ai/)"
            ),
        ],
    ),
    (
        "fa3 on sm_120",
        "rtx-pro-6000-x8",
        {"attention_backend": "fa3"},
        [
            (
                "attention_backend 'fa3' (set in test) cannot run with sglang 0.5.11 on "
                "compute capability 12.0: FlashAttention 3 asserts compute capability major 8 "
                "or 9 (Ampere/Hopper); this GPU is sm_120 (source: "
                "https://pypi.org/project/sglang/); sglang 0.5.11 does not accept it for "
                "hybrid linear-attention models (source: https://pypi.org/project/sglang/); "
                "backends that run here: flashinfer, triton (or auto)"
            ),
        ],
    ),
    (
        "fa4 on sm_120",
        "rtx-pro-6000-x8",
        {"attention_backend": "fa4"},
        [
            (
                "attention_backend 'fa4' (set in test) cannot run with sglang 0.5.11 on "
                "compute capability 12.0: FlashAttention 4 has no SM120 kernels; this GPU is "
                "sm_120 (source: https://github.com/sgl-project/sglang/issues/23985); backends "
                "that run here: flashinfer, triton (or auto)"
            ),
        ],
    ),
    (
        "trtllm_mha on sm_120",
        "rtx-pro-6000-x8",
        {"attention_backend": "trtllm_mha"},
        [
            (
                "attention_backend 'trtllm_mha' (set in test) cannot run with sglang 0.5.11 on "
                "compute capability 12.0: trtllm_mha prefill is SM100-only (0.5.11 raises "
                "ValueError elsewhere); this GPU is sm_120 (source: "
                "https://pypi.org/project/sglang/); backends that run here: flashinfer, triton "
                "(or auto)"
            ),
        ],
    ),
    (
        "flashinfer on 0.5.9 for a hybrid model",
        "rtx-pro-6000-x8",
        {
            "sglang_version": "0.5.9",
            "model_name": "Qwen/Qwen3.5-27B",
            "attention_backend": "flashinfer",
        },
        [
            (
                "attention_backend 'flashinfer' (set in test) cannot run with sglang 0.5.9 on "
                "compute capability 12.0: sglang 0.5.9 does not accept it for hybrid "
                "linear-attention models; in 0.5.9 flashinfer, the sm_120 default, trips an "
                "assert for hybrid models (source: https://pypi.org/project/sglang/); backends "
                "that run here: triton (or auto)"
            ),
        ],
    ),
    (
        "unknown backend",
        "rtx-pro-6000-x8",
        {"attention_backend": "flashnifer"},
        [
            (
                "attention_backend 'flashnifer' (set in test) cannot run with sglang 0.5.11 on "
                "compute capability 12.0: 'flashnifer' is not a known backend (known: "
                "flashinfer, triton, fa3, fa4, trtllm_mha); backends that run here: "
                "flashinfer, triton (or auto)"
            ),
        ],
    ),
    (
        "MTP with flashinfer on 0.5.11",
        "rtx-pro-6000-x8",
        {"attention_backend": "flashinfer", "speculative": {"algorithm": "EAGLE"}},
        [
            (
                "attention_backend 'flashinfer' (set in test) cannot run with sglang 0.5.11 on "
                "compute capability 12.0: MTP with the flashinfer backend needs FlashInfer "
                "newer than 0.6.15.post1; use triton with older releases; sglang 0.5.11 pins "
                "flashinfer 0.6.8.post1 (source: https://pypi.org/project/sglang/; "
                "https://docs.sglang.ai/); backends that run here: triton (or auto)"
            ),
        ],
    ),
    (
        "MTP without extra_buffer",
        "rtx-pro-6000-x8",
        {"mamba_cache_strategy": "no_buffer", "speculative": {"algorithm": "EAGLE"}},
        [
            (
                "mamba_cache_strategy 'no_buffer' (set in test): with the radix cache, "
                "speculative decoding on a hybrid model needs the extra_buffer Mamba cache "
                "strategy (auto means no_buffer in 0.5.11 and then raises); accepted with "
                "speculative: extra_buffer (source: https://pypi.org/project/sglang/; "
                "https://docs.sglang.ai/)"
            ),
        ],
    ),
    (
        "MTP spelt MTP",
        "rtx-pro-6000-x8",
        {"speculative": {"algorithm": "MTP"}},
        [
            (
                "resolved command line: --speculative-algorithm 'MTP' is not accepted by "
                "sglang 0.5.11; accepted: DFLASH, EAGLE, EAGLE3, NEXTN, NGRAM, STANDALONE"
            ),
        ],
    ),
    (
        "a lane that does not exist",
        "rtx-pro-6000-x8",
        {"cuda_lane": "cu118"},
        [
            ("cuda_lane 'cu118' (set in test) is not a known lane; accepted: cu128, cu129, cu130"),
        ],
    ),
    (
        "a GPU the knowledge base does not know",
        "rtx-pro-6000-x8",
        {"gpu_compute_cap": "7.5"},
        [
            (
                "gpu_compute_cap '7.5' (set in test) is not in the knowledge base; accepted: "
                "8.0, 8.6, 8.9, 9.0, 10.0, 10.3, 12.0, 12.1"
            ),
            (
                "attention_backend 'auto': the knowledge base has no preference for compute "
                "capability 7.5; set attention_backend explicitly"
            ),
        ],
    ),
    (
        "more ranks than GPUs",
        "rtx-pro-6000-x8",
        {"dp_size": 9},
        [
            (
                "dp_size 9 (set in test) is more than gpu_count 8 (set in default): one rank "
                "per GPU; accepted: 1 to 8"
            ),
        ],
    ),
    (
        "extra option the release lacks",
        "rtx-pro-6000-x8",
        {"extra_server_args": ["--no-such-option", "1"]},
        [
            "extra_server_args: sglang 0.5.11 has no option --no-such-option",
            "extra_server_args: '1' is not an option (options start with --)",
        ],
    ),
    (
        "extra option misspelt",
        "rtx-pro-6000-x8",
        {"extra_server_args": ["--kv-cache-dtyp", "fp8_e4m3"]},
        [
            (
                "extra_server_args: sglang 0.5.11 has no option --kv-cache-dtyp; did you mean "
                "--kv-cache-dtype?"
            ),
            "extra_server_args: 'fp8_e4m3' is not an option (options start with --)",
        ],
    ),
    (
        "extra option that settings manage",
        "rtx-pro-6000-x8",
        {"extra_server_args": ["--port", "1234"]},
        [
            (
                "extra_server_args (set in test): --port is managed by the setting "
                "'base_port'; set that instead"
            ),
        ],
    ),
    (
        "extra option with a value the release refuses",
        "rtx-pro-6000-x8",
        {"extra_server_args": ["--kv-cache-dtype", "int3"]},
        [
            (
                "extra_server_args: --kv-cache-dtype 'int3' is not accepted by sglang 0.5.11; "
                "accepted: auto, bf16, bfloat16, fp4_e2m1, fp8_e4m3, fp8_e5m2"
            ),
        ],
    ),
    (
        "old Mamba spelling passed by hand to 0.5.23",
        "rtx-pro-6000-x8-driver-580",
        {
            "sglang_version": "0.5.23",
            "cuda_lane": "cu130",
            "extra_server_args": ["--mamba-scheduler-strategy", "auto"],
        },
        [
            (
                "extra_server_args (set in test): --mamba-scheduler-strategy is managed by the "
                "setting 'mamba_cache_strategy'; set that instead (sglang 0.5.23 spells it "
                "--mamba-radix-cache-strategy; 0.5.14-0.5.19 still accept "
                "--mamba-scheduler-strategy as a deprecated alias; 0.5.20+ reject it; source: "
                "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/server_args.py)"
            ),
            (
                "extra_server_args: sglang 0.5.23 has no option --mamba-scheduler-strategy; "
                "did you mean --mamba-radix-cache-strategy?"
            ),
            "extra_server_args: 'auto' is not an option (options start with --)",
        ],
    ),
    (
        "extra_buffer_lazy before the release that has it",
        "rtx-pro-6000-x8",
        {"mamba_cache_strategy": "extra_buffer_lazy"},
        [
            (
                "resolved command line: --mamba-scheduler-strategy 'extra_buffer_lazy' is not "
                "accepted by sglang 0.5.11; accepted: auto, extra_buffer, no_buffer"
            ),
        ],
    ),
]


@pytest.mark.parametrize(
    ("case", "scenario", "settings", "errors"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_refused(case: str, scenario: str, settings: dict[str, Any], errors: list[str]) -> None:
    p = plan(scenario, **settings)
    assert not p.ranks, "a refused plan must not produce ranks"
    assert p.errors == errors


def test_unknown_architecture_is_refused_with_how_to_add_it() -> None:
    model = Model(exists=True, size_bytes=1, architecture="AcmeForCausalLM")
    p = resolve(make_settings(model_name="acme/Unknown-7B"), facts(model=model))
    assert any("AcmeForCausalLM is not in the knowledge base" in e for e in p.errors), p.errors


def test_unknown_model_without_config_is_a_warning_not_a_guess() -> None:
    p = resolve(make_settings(model_name="acme/Unknown-7B"), facts(model=None))
    assert not p.errors and any("architecture unknown" in w for w in p.warnings)


def test_errors_name_the_origin_of_the_setting() -> None:
    p = plan(attention_backend="fa3")
    assert any("(set in test)" in e for e in p.errors)


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("--port", "--port"),
        ("/dev/shm/models/Qwen--Qwen3.6-27B", "/dev/shm/models/Qwen--Qwen3.6-27B"),
        ("a b", '"a b"'),
        ("50%", '"50%%"'),
        ("$HOME", '"$$HOME"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("", '""'),
    ],
)
def test_systemd_quote(arg: str, quoted: str) -> None:
    assert systemd_quote(arg) == quoted


def test_no_buffer_refuses_trtllm_mha_from_0_5_19_and_warns_before() -> None:
    """What each release's no_buffer asserts (knowledge base `mamba_no_buffer`)."""
    newer = resolve(
        make_settings(
            sglang_version="0.5.19",
            mamba_cache_strategy="no_buffer",
            attention_backend="trtllm_mha",
        ),
        facts(),
    )
    assert any("no_buffer" in e and "trtllm_mha" in e for e in newer.errors), newer.errors
    older = resolve(
        make_settings(mamba_cache_strategy="no_buffer", extra_server_args=["--page-size", "16"]),
        facts(),
    )
    assert not older.errors, older.errors
    assert any("--page-size 16" in w for w in older.warnings), older.warnings


def test_trtllm_mha_runs_on_sm120_from_0_5_19_only() -> None:
    newer = resolve(make_settings(sglang_version="0.5.19", attention_backend="trtllm_mha"), facts())
    assert not newer.errors, newer.errors
    refused = resolve(make_settings(attention_backend="trtllm_mha"), facts())
    assert any("SM100-only" in e for e in refused.errors), refused.errors


def _build_settings(release: str, lane: str) -> tuple[str, dict[str, Any]]:
    """The scenario and settings a (release, lane) build plans with on the RTX PRO 6000
    fixtures: a CUDA 13 lane on the 580-driver host, an older release serves Qwen3.5."""
    knowledge = kbmod.load()
    scenario = (
        "rtx-pro-6000-x8"
        if knowledge.lanes[lane].cuda.startswith("12.")
        else ("rtx-pro-6000-x8-driver-580")
    )
    model = knowledge.models["Qwen/Qwen3.6-27B"]
    settings: dict[str, Any] = {"sglang_version": release, "cuda_lane": lane}
    if model.min_release and kbmod.version(release) < kbmod.version(model.min_release):
        settings["model_name"] = "Qwen/Qwen3.5-27B"
    return scenario, settings


UNPROVEN_BUILDS = [
    pytest.param(release, build.lane.name, id=f"{release}-{build.lane.name}")
    for release in RELEASES
    for build in kbmod.load().releases[release].builds
    if build.unproven
]


@pytest.mark.parametrize(("release", "lane"), UNPROVEN_BUILDS)
def test_an_unproven_build_is_warned_with_its_sources(release: str, lane: str) -> None:
    """Every unproven part of a build the knowledge base lists reaches the plan as a warning."""
    scenario, settings = _build_settings(release, lane)
    p = plan(scenario, **settings)
    assert not p.errors, p.errors
    build = kbmod.load().releases[release].build(lane)
    assert build is not None
    unproven = [w for w in p.warnings if f"sglang {release} on {lane} is unproven" in w]
    assert len(unproven) == len(build.unproven), unproven
    for entry in build.unproven:
        assert any(entry.what in w for w in unproven), entry.what
    assert all("(source: https://" in w for w in unproven), unproven


@pytest.mark.parametrize(
    ("release", "cap", "lane", "driver", "wanted"),
    [
        # flashinfer 0.6.8.post1 (0.5.11) and 0.6.18 (0.5.19) raise for SM 12.x below CUDA 12.9:
        # every compiler older than 12.9 gets the arch with its suffix (0.5.9's 0.6.3 would pick
        # it itself; one rule).
        ("0.5.11", "12.0", "cu128", "570.172.08", {"FLASHINFER_CUDA_ARCH_LIST": "12.0a"}),
        ("0.5.19", "12.0", "cu128", "580.65.06", {"FLASHINFER_CUDA_ARCH_LIST": "12.0a"}),
        ("0.5.9", "12.0", "cu128", "570.172.08", {"FLASHINFER_CUDA_ARCH_LIST": "12.0a"}),
        # A 12.9 compiler builds 120f, which a driver before 575 cannot load; unknown counts.
        ("0.5.11", "12.0", "cu129", "570.172.08", {"FLASHINFER_CUDA_ARCH_LIST": "12.0a"}),
        ("0.5.11", "12.0", "cu129", None, {"FLASHINFER_CUDA_ARCH_LIST": "12.0a"}),
        ("0.5.11", "12.0", "cu129", "575.51.03", {}),
        # Other chips, and CUDA 13, are not affected.
        ("0.5.11", "9.0", "cu128", "570.172.08", {}),
        ("0.5.23", "12.0", "cu130", "580.65.06", {}),
    ],
)
def test_rank_environment_follows_the_flashinfer_gpu_compiler_and_driver(
    release: str, cap: str, lane: str, driver: str | None, wanted: dict[str, str]
) -> None:
    knowledge = kbmod.load()
    rules = knowledge.rank_environment_for(release, cap, lane, driver)
    assert {r.variable: r.value for r in rules} == wanted


def test_every_rank_sets_the_engines_compiler_first_on_its_path() -> None:
    p = plan()
    assert p.engine is not None and p.engine.toolkit is not None
    home = p.engine.toolkit.home("/opt/sglang")
    assert home.startswith("/opt/sglang/cuda/12.8.93-")
    for r in p.ranks:
        assert r.env["CUDA_HOME"] == home
        assert r.env["PATH"].split(":")[:2] == [f"{home}/bin", "/usr/local/sbin"]
        assert f'Environment="CUDA_HOME={home}"\n' in r.unit
    (decision,) = [d for d in p.decisions if d.what == "engine compiler"]
    assert decision.value == f"nvcc 12.8.93 -> CUDA_HOME {home}"
    assert "cuda_nvcc 12.8.93, cuda_cudart 12.8.90, cuda_cccl 12.8.90" in decision.why
    assert "redistrib_12.8.1.json" in decision.why


def test_the_rank_environment_is_in_the_unit_and_explained_in_the_plan() -> None:
    p = plan()
    assert p.ranks and all(
        'Environment="FLASHINFER_CUDA_ARCH_LIST=12.0a"\n' in r.unit for r in p.ranks
    )
    (decision,) = [d for d in p.decisions if d.what == "rank environment"]
    assert decision.value == "FLASHINFER_CUDA_ARCH_LIST=12.0a" and "sm75" in decision.why


@pytest.mark.parametrize("release", [r for r in RELEASES if kbmod.load().no_buffer_rule(r)])
def test_no_buffer_plans_what_the_release_asserts(release: str) -> None:
    """An explicit no_buffer asserts the overlap schedule off at start where the release says so
    (ServerArgs._validate_mamba_no_buffer): the plan adds the flag, and the release's own
    table has it; older releases turn it off themselves and get nothing added."""
    knowledge = kbmod.load()
    rule = knowledge.no_buffer_rule(release)
    assert rule is not None
    lane = knowledge.releases[release].lanes[0]
    scenario = "rtx-pro-6000-x8" if lane != "cu130" else "rtx-pro-6000-x8-driver-580"
    model = {"model_name": "Qwen/Qwen3.5-27B"} if release == RELEASES[0] else {}
    p = resolve(
        make_settings(
            sglang_version=release, cuda_lane=lane, mamba_cache_strategy="no_buffer", **model
        ),
        facts(scenario),
    )
    assert p.ranks, p.errors
    argv = p.ranks[0].argv
    start = json.loads((kbmod.KNOWLEDGE_DIR / "asserts" / f"sglang-{release}.json").read_text())
    asserts_overlap = any(
        "overlap schedule" in m for m in start["asserts"].get("validate_mamba_no_buffer", [])
    )
    assert ("--disable-overlap-schedule" in argv) == asserts_overlap, argv
    assert ("--disable-overlap-schedule" in argv) == bool(rule.adds)


@pytest.mark.parametrize(
    ("speculative", "wanted"),
    [
        # extra_buffer asserts mamba_track_interval (256) >= speculative_num_draft_tokens.
        ({"algorithm": "EAGLE", "num_steps": 3, "num_draft_tokens": 257}, "at most 256"),
        # Without num_steps SGLang asserts eagle_topk and num_draft_tokens unset.
        ({"algorithm": "EAGLE", "eagle_topk": 1}, "need num_steps"),
    ],
)
def test_a_speculative_setting_sglang_asserts_on_is_refused(
    speculative: dict[str, Any], wanted: str
) -> None:
    p = resolve(make_settings(speculative=speculative), facts())
    assert not p.ranks and any(wanted in e for e in p.errors), p.errors
    fine = resolve(
        make_settings(speculative={**speculative, "num_steps": 3, "num_draft_tokens": 4}), facts()
    )
    assert not any(wanted in e for e in fine.errors), fine.errors
