"""The plan's `clients` row: which URL a client uses and whether it sends a key, decided once in
operations/plan/resolver/clients.py and shown by the dry run's box (docs/samples/plan-box.txt,
from the simulated host: tests/unit/test_doc_samples.py)."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

from operations.cli.api_key import make_key
from operations.plan.resolver import resolve
from tests.unit.builders import facts, make_settings


def clients(**settings: object) -> tuple[str, str]:
    s = make_settings(**settings)
    if "api_key_file" in settings:  # a path the loader never reads: the decision only names it
        s = dataclasses.replace(s, api_key_file=str(settings["api_key_file"]))
    (decision,) = [d for d in resolve(s, facts()).decisions if d.what == "clients"]
    return decision.value, decision.why


def test_without_a_router_clients_use_a_ranks_port_and_are_told_so() -> None:
    value, why = clients()
    assert value == "http://127.0.0.1:30000/v1 (one rank; ports 30000-30007); no key"
    assert "no router in front" in why and "anyone who reaches it is served" in why


def test_behind_the_router_clients_use_the_gateway_with_the_key() -> None:
    router = {"host": "ct200", "port": 8000, "bind": "0.0.0.0"}
    value, why = clients(router=router, api_key_file="/etc/keys/api.key")
    assert value == "http://ct200:8000/v1 (the router); key"
    assert "api_key_file /etc/keys/api.key as a bearer token" in why


def test_a_router_bound_to_one_address_is_reached_there() -> None:
    value, _ = clients(router={"host": "ct200", "port": 8080, "bind": "10.0.0.5"})
    assert value.startswith("http://10.0.0.5:8080/v1 (the router)")


def test_make_api_key_writes_a_key_once_with_mode_600(tmp_path: Path) -> None:
    key = tmp_path / "locks" / "api.key"
    said = make_key(key)
    assert said.startswith(f"api-key: {key}: a new key (mode 600)")
    text = key.read_text()
    assert text.startswith("sk-") and len(text.strip()) == 46 and text.strip() not in said
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # The settings loader takes it as an API key (one non-empty line, the owner's, mode 600).
    make_settings(api_key_file=str(key))
    assert "already there; kept" in make_key(key) and key.read_text() == text
