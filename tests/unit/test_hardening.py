"""Issue 11 findings at the lowest layer that shows them (one test each): credentials in URLs
are redacted wherever they are shown, distinct sources never share a cache directory, and the
health wait never goes through a proxy."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from operations.cli import status as st
from operations.redact import redact, redact_data, redact_text
from operations.render.host_scripts import load
from tests.unit.builders import make_settings

ROOT = Path(__file__).resolve().parents[2]


def test_redaction_hides_userinfo_only() -> None:
    assert redact("https://user:tok@mirror.example/simple") == "https://***@mirror.example/simple"
    assert redact("https://pypi.org/simple") == "https://pypi.org/simple"
    text = "package_index_url = 'https://u:p@a.example/s' and http://t@b.example/x; mail a@b.c"
    assert redact_text(text) == (
        "package_index_url = 'https://***@a.example/s' and http://***@b.example/x; mail a@b.c"
    )
    assert redact_data({"k": ["https://u:p@x/", 1]}) == {"k": ["https://***@x/", 1]}


def test_status_json_never_shows_a_url_credential() -> None:
    # A settings problem quoting an index URL, as operations.status shows an invalid host.
    error = "settings: package_index_url = 'https://deploy:s3cret@mirror.example/simple x'"
    broken = st.HostResult("ct201", reachable=False, error=error, invalid_settings=True)
    document = json.dumps(st.to_json([broken]))
    assert "s3cret" not in document and "https://***@mirror.example" in document


def test_two_controller_sources_with_one_basename_never_share_a_cache_dir() -> None:
    a = make_settings(model_source="controller:/srv/a/Qwen3").source.target_dir
    b = make_settings(model_source="controller:/srv/b/Qwen3").source.target_dir
    assert a != b and a.startswith("/var/cache/sglang-models/controller/Qwen3@")
    # The same source keeps its directory from run to run (the cache is reused).
    assert a == make_settings(model_source="controller:/srv/a/Qwen3/").source.target_dir


@pytest.fixture
def wait_healthy() -> ModuleType:
    return load("wait_healthy.py", "wait_healthy")


@pytest.fixture
def health_server() -> Iterator[str]:
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/health"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_health_wait_ignores_proxies(
    wait_healthy: ModuleType, health_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy that answers nothing: honouring it would make a healthy server look dead.
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert wait_healthy.healthy(health_server)
