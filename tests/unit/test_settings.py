"""Settings: every bad value gets one line naming the key, the value, where it was set and what
is accepted; all problems are reported at once."""

from __future__ import annotations

from typing import Any

import pytest

from operations.runtime.pyinfra_internals import connector_data_keys
from operations.settings import COMMAND_LINE, Layer, SettingsError, defaults, load

GOOD = {"model_source": "/mnt/models/Qwen3.6-27B"}
ORIGIN = "group_data/all.py"


def problems_for(data: dict[str, Any], label: str = ORIGIN) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        load("ct200", [Layer(label, {**GOOD, **data})])
    return caught.value.problems


def test_defaults_apply_and_good_settings_load() -> None:
    settings = load("ct200", [Layer(ORIGIN, GOOD)])
    assert settings.sglang_version == "0.5.11"
    assert settings.cuda_lane == "cu128"
    assert settings.dp_size == 8 and settings.base_port == 30000
    assert settings.attention_backend == "auto"
    assert settings.mamba_cache_strategy == "extra_buffer"
    assert settings.speculative is None
    assert settings.origin("model_source") == ORIGIN
    assert settings.origin("dp_size") == "default"


def test_every_documented_key_has_a_default_or_is_required() -> None:
    from operations.settings import schema

    props = schema()["properties"]
    required = set(schema()["required"])
    for key, prop in props.items():
        assert "default" in prop or key in required, key
        assert prop.get("x-accepts") and prop.get("description"), key
    assert set(defaults()) | required == set(props)


def test_higher_layers_win_and_are_named() -> None:
    settings = load(
        "ct200",
        [
            Layer(COMMAND_LINE, {"dp_size": 4}),
            Layer("the inventory entry of host ct200", {"dp_size": 6, "base_port": 31000}),
            Layer(ORIGIN, {**GOOD, "dp_size": 8}),
        ],
    )
    assert settings.dp_size == 4 and settings.origin("dp_size") == COMMAND_LINE
    assert settings.base_port == 31000


def test_command_line_numbers_become_text_for_text_settings() -> None:
    # pyinfra's --data parses "12.0" into a float.
    settings = load("ct200", [Layer(COMMAND_LINE, {"gpu_compute_cap": 12.0}), Layer(ORIGIN, GOOD)])
    assert settings.gpu_compute_cap == "12.0"


def test_pyinfra_connector_keys_are_not_ours_to_judge() -> None:
    """The keys pyinfra's connectors read come in as a value, as the inventory session hands
    them (settings import nothing of runtime/)."""
    settings = load(
        "ct200",
        [
            Layer(
                ORIGIN, {**GOOD, "ssh_user": "root", "ssh_port": 22, "_sudo": True, "fake_delay": 0}
            )
        ],
        connector_keys=connector_data_keys(),
    )
    assert settings.model_source == GOOD["model_source"]


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    # (case, data, key that must be named, text that must appear)
    (
        "typo in a key",
        {"sglang_verison": "0.5.11"},
        "sglang_verison",
        "did you mean 'sglang_version'",
    ),
    (
        "typo in another key",
        {"attention_backed": "triton"},
        "attention_backed",
        "'attention_backend'",
    ),
    ("unknown key far from any", {"flavour": "blue"}, "flavour", "Configuration reference"),
    ("version without patch", {"sglang_version": "0.5"}, "sglang_version", "exact SGLang release"),
    ("version as a number", {"sglang_version": 0.5}, "sglang_version", "exact SGLang release"),
    ("lane misspelt", {"cuda_lane": "cuda128"}, "cuda_lane", "CUDA lane such as"),
    (
        "relative model_source",
        {"model_source": "models/qwen"},
        "model_source",
        "absolute directory",
    ),
    ("relative stage dir", {"model_stage_dir": "dev/shm"}, "model_stage_dir", "absolute directory"),
    ("model name with spaces", {"model_name": "Qwen 3.6"}, "model_name", "without spaces"),
    ("dp_size zero", {"dp_size": 0}, "dp_size", "from 1 to 64"),
    ("dp_size as text", {"dp_size": "8"}, "dp_size", "from 1 to 64"),
    ("gpu_count negative", {"gpu_count": -1}, "gpu_count", "from 1 to 64"),
    ("compute cap as a number", {"gpu_compute_cap": 12}, "gpu_compute_cap", "compute capability"),
    ("privileged port", {"base_port": 80}, "base_port", "1024 to 65471"),
    ("port past the range", {"base_port": 70000}, "base_port", "1024 to 65471"),
    (
        "memory fraction above 1",
        {"mem_fraction_static": 1.5},
        "mem_fraction_static",
        "at most 0.99",
    ),
    ("memory fraction zero", {"mem_fraction_static": 0}, "mem_fraction_static", "above 0"),
    (
        "mamba strategy unknown",
        {"mamba_cache_strategy": "extra"},
        "mamba_cache_strategy",
        "extra_buffer",
    ),
    ("speculative as text", {"speculative": "EAGLE"}, "speculative", "false, or a mapping"),
    (
        "speculative unknown field",
        {"speculative": {"algorithm": "EAGLE", "steps": 3}},
        "speculative",
        "num_steps",
    ),
    ("extra args as text", {"extra_server_args": "--foo"}, "extra_server_args", "list of strings"),
    ("extra args not strings", {"extra_server_args": [1]}, "extra_server_args", "list of strings"),
    ("backend with spaces", {"attention_backend": "Flash Infer"}, "attention_backend", "auto"),
    ("host with a space", {"server_host": "0.0.0.0 "}, "server_host", "IP address or host name"),
    ("metrics as text", {"enable_metrics": "yes"}, "enable_metrics", "true or false"),
    ("graph batch zero", {"cuda_graph_max_bs": 0}, "cuda_graph_max_bs", "positive integer"),
    ("running zero", {"max_running_requests": 0}, "max_running_requests", "positive integer"),
    ("running as text", {"max_running_requests": "64"}, "max_running_requests", "positive"),
    ("prefill chunk zero", {"chunked_prefill_size": 0}, "chunked_prefill_size", "positive"),
    (
        "conservativeness below zero",
        {"schedule_conservativeness": -0.5},
        "schedule_conservativeness",
        "a number from 0",
    ),
    (
        "conservativeness as text",
        {"schedule_conservativeness": "low"},
        "schedule_conservativeness",
        "a number from 0",
    ),
    ("service user uppercase", {"service_user": "SGLang"}, "service_user", "system user name"),
]


@pytest.mark.parametrize(("case", "data", "key", "text"), BAD, ids=[b[0] for b in BAD])
def test_bad_setting_is_one_clear_line(
    case: str, data: dict[str, Any], key: str, text: str
) -> None:
    problems = problems_for(data)
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith("ct200: ") and key in line and text in line, line
    assert ORIGIN in line, line
    assert "\n" not in line


def test_missing_required_key_says_it_is_not_set() -> None:
    with pytest.raises(SettingsError) as caught:
        load("ct200", [Layer(ORIGIN, {})])
    (line,) = caught.value.problems
    assert "model_source is not set" in line and "absolute directory" in line


def test_all_problems_are_reported_at_once() -> None:
    problems = problems_for({"dp_size": 0, "base_port": 80, "sglang_verison": "x"})
    assert len(problems) == 3
    assert {p.split()[1] for p in problems} == {"dp_size", "base_port", "unknown"}


def test_bad_messages_are_distinct() -> None:
    lines = [problems_for(data)[0] for _, data, _, _ in BAD]
    assert len(set(lines)) == len(BAD)
