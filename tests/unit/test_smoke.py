"""The smoke request's pure parts: judging raw answers (operations/files/smoke.py, imported as
the host runs it), reading the key file, and which targets a deploy asks (operations/smoke.py).
The requests themselves, with httpx on the host, run end to end
(tests/e2e/test_smoke.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.facts.serve import Serving, UnitState
from operations.host_files import sha256
from operations.host_scripts import load
from operations.resolver import Rank, RouterPlan
from operations.roll import router_restarts, smoke_targets
from tests.unit.builders import make_settings

MODEL = "Qwen/Qwen3.6-27B"
ROOT = Path(__file__).resolve().parents[2]


# The script as the host runs it (operations/host_scripts.py).
script = load("smoke.py", "smoke_script")


def reply(model: str = MODEL, **changes: Any) -> str:
    """A chat completion as SGLang's ChatCompletionResponse serialises it."""
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1767225600,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Ready.", "reasoning_content": None},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 8, "total_tokens": 20, "completion_tokens": 12},
    }
    body.update(changes)
    return json.dumps(body)


MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

# -- judging --------------------------------------------------------------------------------


def test_a_right_answer_passes_with_its_tokens() -> None:
    assert script.judge_models(200, MODELS, MODEL) is None
    assert script.judge_chat(200, reply(), MODEL) == (None, 12)


def test_a_reasoning_models_first_tokens_may_all_be_reasoning() -> None:
    message = {"role": "assistant", "content": None, "reasoning_content": "Let me think"}
    body = reply(choices=[{"index": 0, "message": message, "finish_reason": "length"}])
    assert script.judge_chat(200, body, MODEL) == (None, 12)


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (200, "", "200 with an empty body"),
        (200, "   \n", "200 with an empty body"),
        (200, '{"id": "chatcmpl-double", "choi', "200 with a malformed body"),
        (200, "<html>Bad Gateway</html>", "200 with a malformed body"),
        (200, "[1, 2]", "not a JSON object"),
        (200, reply(model="other/model"), "answered for model 'other/model'"),
        (200, reply(choices=[]), "without choices[0].message"),
        (
            200,
            reply(choices=[{"index": 0, "message": {"role": "assistant", "content": ""}}]),
            "with an empty message",
        ),
        (200, reply(usage={"prompt_tokens": 8}), "without usage.completion_tokens"),
        (200, reply(usage={"completion_tokens": 0}), "without usage.completion_tokens"),
        (401, '{"error": "Unauthorized"}', "HTTP 401"),
        (503, "", "HTTP 503"),
        (None, "", "no answer"),
    ],
)
def test_a_wrong_chat_answer_fails_and_says_why(status: int | None, body: str, why: str) -> None:
    verdict, tokens = script.judge_chat(status, body, MODEL)
    assert verdict is not None and why in verdict and tokens is None


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (200, json.dumps({"object": "list", "data": [{"id": "other"}]}), "serves ['other']"),
        (200, json.dumps({"object": "list"}), "without a model list"),
        (200, "", "empty body"),
        (401, '{"error": "Unauthorized"}', "HTTP 401"),
        (None, "", "no answer"),
    ],
)
def test_a_wrong_model_list_fails(status: int | None, body: str, why: str) -> None:
    verdict = script.judge_models(status, body, MODEL)
    assert verdict is not None and why in verdict


def test_a_long_bad_body_is_cut_short() -> None:
    verdict, _ = script.judge_chat(200, "x" * 5000, MODEL)
    assert verdict is not None and len(verdict) < 300


def test_targets_on_the_command_line() -> None:
    assert script.parse_target("sglang@3.service=http://127.0.0.1:30003/v1") == (
        "sglang@3.service",
        "http://127.0.0.1:30003/v1",
        1,
    )
    assert script.parse_target("router=http://127.0.0.1:8000/v1/*4") == (
        "router",
        "http://127.0.0.1:8000/v1",
        4,
    )
    with pytest.raises(ValueError, match="NAME=URL"):
        script.parse_target("http://127.0.0.1:8000/v1")


def test_the_key_is_read_from_sglangs_config_file(tmp_path: Path) -> None:
    key = 'sk-"quoted"\\x'
    path = tmp_path / "secrets.yaml"
    path.write_text(f"api-key: {json.dumps(key)}\n")  # as operations/serve.py writes it
    assert script.read_key(str(path)) == key
    assert script.read_key(str(tmp_path / "absent.yaml")) is None
    assert script.read_key(None) is None


def test_a_failed_target_is_described_with_its_reason() -> None:
    bad = script.Verdict("sglang@3.service", False, why="POST ...: 200 with an empty body")
    assert script.describe(bad) == (
        "sglang@3.service: did NOT answer as a client expects: POST ...: 200 with an empty body"
    )
    good = script.Verdict("router", True, 0.05, 48, 4)
    assert script.describe(good) == "router: answered 4 request(s), 0.05s, 48 tokens"


# -- what a deploy asks ---------------------------------------------------------------------


def rank(n: int) -> Rank:
    return Rank(
        rank=n,
        gpu=n,
        port=30000 + n,
        argv=[],
        env={},
        unit_name=layout.unit_name(n),
        unit="",
        engine_env="/opt/sglang/envs/e",
    )


ROUTER = {"host": "ct200", "port": 8000, "bind": "0.0.0.0"}


def router_plan(unit: str = "[Unit]\n") -> RouterPlan:
    return RouterPlan([], unit, [], "", "/opt/sglang/router/sglang-router-0.3.2", "0.3.2")


def test_each_restarted_rank_once_and_the_router_a_few_times() -> None:
    s = make_settings(server_host="127.0.0.10", router=ROUTER, smoke_router_requests=3)
    targets = smoke_targets(s, [rank(0), rank(5)], router_plan(), router_too=True)
    assert targets == [
        "sglang@0.service=http://127.0.0.10:30000/v1",
        "sglang@5.service=http://127.0.0.10:30005/v1",
        # bound to every address: the host reaches it on loopback
        "router=http://127.0.0.1:8000/v1*3",
    ]
    assert smoke_targets(s, [rank(1)], router_plan(), router_too=False) == [
        "sglang@1.service=http://127.0.0.10:30001/v1"
    ]
    assert smoke_targets(s, [], None, router_too=False) == []
    none = make_settings(router=ROUTER, smoke_router_requests=0)
    assert smoke_targets(none, [], router_plan(), router_too=True) == []


def test_the_router_is_asked_when_it_restarts() -> None:
    plan = router_plan()
    marker = f"{plan.env_dir}/{layout.ROUTER_MARKER}"
    unit_path = layout.unit_path(layout.ROUTER_UNIT)
    running = UnitState(unit_sha256="x", load="loaded", active="active", sub="running")
    same = Serving(router=running, files={unit_path: sha256(plan.unit), marker: "y"})
    assert router_restarts(same, plan) is False
    changed = Serving(router=running, files={unit_path: sha256("old"), marker: "y"})
    assert router_restarts(changed, plan) is True
    stopped = Serving(router=UnitState(active="failed"), files=same.files)
    assert router_restarts(stopped, plan) is True
    assert router_restarts(Serving(router=running, files={unit_path: sha256(plan.unit)}), plan)


def test_the_setting_defaults() -> None:
    s = make_settings()
    assert (s.smoke_requests, s.smoke_router_requests, s.smoke_timeout_s) == (True, 4, 120)
