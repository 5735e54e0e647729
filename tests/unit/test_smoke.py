"""The smoke request's pure parts: judging raw answers (operations/programs/smoke.py, imported as
the host runs it), reading the key file, and which targets a deploy asks
(operations/steps/smoke.py).
The requests themselves, with httpx on the host, run end to end
(tests/e2e/test_smoke.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from operations import layout
from operations.facts.serve import Serving, UnitState
from operations.plan.planned_files import sha256
from operations.plan.resolver import Rank, RouterPlan
from operations.plan.serve_plan import router_restarts
from operations.plan.smoke_plan import smoke_targets
from operations.render.host_scripts import load
from tests.doubles import wheels
from tests.unit.builders import make_settings

MODEL = "Qwen/Qwen3.6-27B"
ROOT = Path(__file__).resolve().parents[2]


# The script as the host runs it (operations/render/host_scripts.py).
script = load("smoke.py", "smoke_script")


ASKED = (317, 425)  # "What is 317 + 425?"


def reply(model: str = MODEL, content: str | None = "742", **changes: Any) -> str:
    """A chat completion as SGLang's ChatCompletionResponse serialises it."""
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1767225600,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "reasoning_content": None},
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
    assert script.judge_chat(200, reply(), MODEL, ASKED) == (None, 12)


def test_the_question_is_the_prompt_contract_and_differs_every_request() -> None:
    # Two integers joined by `+`, the sum the answer: the doubles parse exactly this shape.
    assert script.question(317, 425) == "What is 317 + 425? Reply with the number only."
    request = script.chat_request(MODEL, 317, 425)
    assert request == {
        "model": MODEL,
        "messages": [{"role": "user", "content": script.question(317, 425)}],
        "max_tokens": script.MAX_TOKENS,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    pairs = {script.operands() for _ in range(50)}
    assert all(100 <= n <= 999 for pair in pairs for n in pair)
    assert len(pairs) > 40  # fresh numbers each time, not one pair a run


@pytest.mark.parametrize(
    "content",
    [
        "742",
        "742.",
        " The answer is 742.\n",
        "317 + 425 = 742",  # an echo of the question: its operands may appear
        "742.0",
        "<think>\n\n</think>\n\n742",  # an empty thinking block (enable_thinking false)
        "300 + 400 is 700...</think>\n\n742",  # Qwen3's opening tag in the prompt
    ],
)
def test_the_right_sum_passes(content: str) -> None:
    assert script.judge_sum(content, *ASKED) is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("743", "the sum is 742"),
        ("-742", "the sum is 742"),
        ("7420", "the sum is 742"),
        ("742 or 743", "the sum is 742, and it also says 743"),
        ("300 + 400 = 700, so 742", "the sum is 742, and it also says 300, 400, 700"),
        ("317 + 425", "the sum is 742"),
        ("Sure!", "no number in the answer"),
        ("", "no number in the answer"),
        ("<think>\nLet me add 317 and 425: 742", "no number in the answer"),  # cut off thinking
        ("<think>742</think>\n\nI cannot say.", "no number in the answer"),
    ],
)
def test_a_wrong_sum_or_no_answer_fails_and_says_why(content: str, why: str) -> None:
    assert script.judge_sum(content, *ASKED) == why


def test_a_wrong_answer_names_the_question_and_the_answer() -> None:
    verdict, tokens = script.judge_chat(200, reply(content="The answer is 743."), MODEL, ASKED)
    assert verdict == (
        "POST /v1/chat/completions: not a truthful answer: asked 'What is 317 + 425? Reply with "
        "the number only.', answered 'The answer is 743.' (the sum is 742)"
    )
    assert tokens is None


def test_an_answer_all_in_reasoning_content_is_no_answer() -> None:
    # A reasoning parser put every token into reasoning_content: thinking was not disabled.
    message = {"role": "assistant", "content": None, "reasoning_content": "Let me add 317 and"}
    body = reply(choices=[{"index": 0, "message": message, "finish_reason": "length"}])
    verdict, _ = script.judge_chat(200, body, MODEL, ASKED)
    assert verdict is not None
    assert "no number in the answer: the content is empty, all of it reasoning" in verdict
    # Without a question (shape only), reasoning alone is still a well-formed answer.
    assert script.judge_chat(200, body, MODEL) == (None, 12)


class _Answer:
    def __init__(self, text: str) -> None:
        self.status_code, self.text = 200, text


class _Httpx:
    TimeoutException = TimeoutError
    HTTPError = OSError


def test_a_wrong_answer_is_shown_masked_as_a_journal_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() judges, then prints each verdict masked: a reply that echoes the key (or a
    token=...) never shows it. (The requests themselves are httpx's: end to end.)"""
    key = "sk-smoke-echo-5c1d9e"
    body = reply(content=f"{key} token=hf_abc 743")

    class Client:
        def get(self, url: str) -> _Answer:
            return _Answer(MODELS)

        def post(self, url: str, json: Any) -> _Answer:
            assert json == script.chat_request(MODEL, *ASKED)
            return _Answer(body)

    monkeypatch.setattr(script, "operands", lambda: ASKED)
    monkeypatch.setattr(script, "guard_for", lambda *args: script._no_guard)
    monkeypatch.setattr(script, "_client", lambda *args: Client())
    monkeypatch.setattr(script, "_httpx", lambda: _Httpx)
    key_file = tmp_path / "secrets.yaml"
    key_file.write_text(f"api-key: {json.dumps(key)}\n")
    argv = ["--model", MODEL, "--timeout", "5", "--key-file", str(key_file)]
    argv += ["--service-user", "sglang", "sglang@3.service=http://127.0.0.1:30003/v1"]
    assert script.main(argv) == 1
    out = capsys.readouterr().out
    assert key not in out and "hf_abc" not in out, out
    assert out == (
        "sglang@3.service: did NOT answer as a client expects: POST /v1/chat/completions: "
        "not a truthful answer: asked 'What is 317 + 425? Reply with the number only.', answered "
        "'*** token='***' 743' (the sum is 742)\n"
    )


@pytest.fixture(scope="module")
def double_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SGLang server double's wheel (0.5.11) unpacked: a PYTHONPATH."""
    out = tmp_path_factory.mktemp("sglang-double")
    with zipfile.ZipFile(wheels.sglang_wheel(out, "0.5.11")) as zf:
        zf.extractall(out / "site")
    return out / "site"


def double_replies(site: Path, requests: list[dict[str, Any]], reply: str) -> list[list[str]]:
    """What the server double answers each request with (its reply_text, in its own
    interpreter), SGLANG_DOUBLE_REPLY=`reply`."""
    code = (
        "import json, sys; from sglang._server_double import reply_text; "
        "print(json.dumps([reply_text(r, sys.argv[1], 'm') for r in json.loads(sys.argv[2])]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, reply, json.dumps(requests)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    answers: list[list[str]] = json.loads(proc.stdout)
    return answers


@pytest.mark.integration
def test_the_double_answers_the_smokes_question_and_a_wrong_rank_is_caught(
    double_site: Path,
) -> None:
    asked = [script.operands() for _ in range(5)]
    requests = [script.chat_request(MODEL, a, b) for a, b in asked]
    right = double_replies(double_site, requests, "")
    assert [
        script.judge_sum(content, *ab) for (content, _), ab in zip(right, asked, strict=True)
    ] == [None] * 5
    wrong = double_replies(double_site, requests, "wrong-sum")
    for (content, finish), (a, b) in zip(wrong, asked, strict=True):
        assert (content, finish) == (str(a + b + 1), "stop")  # fluent, well-formed, wrong
        assert script.judge_sum(content, a, b) == f"the sum is {a + b}"
    # Thinking not disabled: a Qwen3 model thinks first, and no answer comes in MAX_TOKENS.
    thinking = [{k: v for k, v in r.items() if k != "chat_template_kwargs"} for r in requests]
    for (content, finish), ab in zip(double_replies(double_site, thinking, ""), asked, strict=True):
        assert content.startswith("<think>") and finish == "length"
        assert script.judge_sum(content, *ab) == "no number in the answer"
    # Any other prompt: the greeting other tests send ("hi").
    (hello,) = double_replies(double_site, [{"messages": [{"role": "user", "content": "hi"}]}], "")
    assert hello == ["Hello from the SGLang test double serving m.", "stop"]


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
    verdict, tokens = script.judge_chat(status, body, MODEL, ASKED)
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
    path.write_text(f"api-key: {json.dumps(key)}\n")  # as operations/steps/serve.py writes it
    assert script.read_api_key(str(path)) == key
    assert script.read_api_key(str(tmp_path / "absent.yaml")) is None
    assert script.read_api_key(None) is None


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
    marker = layout.router_marker(plan.env_dir)
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


def test_the_routers_requests_go_at_once_each_guarded_and_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """COUNT requests through the router are in flight together (a Barrier of COUNT parties
    lets no request answer until all were sent: sent one after another, the first would wait
    out the barrier's timeout and fail), each after its own guard; one wrong answer fails the
    target."""
    count = 4
    barrier = threading.Barrier(count, timeout=20)
    guards: list[int] = []
    sums = iter([(100 + i, 200 + i) for i in range(count)])

    class Client:
        def post(self, url: str, json: Any) -> _Answer:
            barrier.wait()  # BrokenBarrierError (a failed request) unless all COUNT are in flight
            a, b = (int(n) for n in re.findall(r"\d+", json["messages"][-1]["content"]))
            return _Answer(reply(content=str(a + b + (1 if a == 102 else 0))))

    monkeypatch.setattr(script, "operands", lambda: next(sums))
    monkeypatch.setattr(script, "_client", lambda *args: Client())
    monkeypatch.setattr(script, "_httpx", lambda: _Httpx)

    def guard() -> str | None:
        guards.append(1)
        return None

    verdict = script.ask("router", "http://r/v1", count, MODEL, None, 5, guard)
    assert not verdict.answered and verdict.requests == count, verdict
    assert "asked 'What is 102 + 202?" in (verdict.why or ""), verdict
    # The router's first request follows the guard made before the client, at once.
    assert len(guards) == count, guards


@pytest.mark.integration  # runs a systemctl double
def test_every_units_state_comes_from_one_systemctl_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """units_active (programs/hostsafe.py) asks systemd once for all units (a block each, in the
    order named); an answer without one state per unit is asked again unit by unit."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    # `systemctl show A B -p ActiveState`: a block per unit, blank lines between; unit b is
    # failed; a call naming "odd" answers one block only.
    systemctl.write_text(
        f"""#!/bin/sh
echo "$*" >> {calls}
shift
first=1
for unit in "$@"; do
  case "$unit" in -p|ActiveState) continue ;; esac
  [ "$first" = 1 ] || echo
  first=0
  case "$unit" in b.service) echo ActiveState=failed ;; *) echo ActiveState=active ;; esac
  [ "$unit" = odd.service ] && [ "$#" -gt 3 ] && break
done
exit 0
"""
    )
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    states = script.units_active(["a.service", "b.service", "a.service", "c.service"])
    assert states == {"a.service": "active", "b.service": "failed", "c.service": "active"}
    assert calls.read_text().splitlines() == ["show a.service b.service c.service -p ActiveState"]
    calls.unlink()
    odd = script.units_active(["odd.service", "b.service"])
    assert odd == {"odd.service": "active", "b.service": "failed"}
    assert len(calls.read_text().splitlines()) == 3  # both at once, then one by one
