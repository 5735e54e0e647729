"""The ServingState fact checksums every managed file with one `sha256sum` (GNU coreutils,
run here for real): each file read back under its own path, a name with a backslash or a
space included (sha256sum escapes the first), a missing file absent."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from operations.facts.serve import ServingState, parse_serving

pytestmark = pytest.mark.integration  # runs the ServingState fact's command


def test_every_managed_file_is_read_back_under_its_path(tmp_path: Path) -> None:
    names = ["wait_healthy.py", "odd\\name.json", "with space.yaml"]
    paths = []
    for name in names:
        path = tmp_path / name
        path.write_text(f"content of {name}\n")
        paths.append(str(path))
    missing = str(tmp_path / "secrets.yaml")
    command = ServingState().command(
        engine_root=str(tmp_path / "engine"),
        model_link=str(tmp_path / "models" / "m"),
        paths=[*paths, missing],
        ranks=[],
        router=False,
    )
    out = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )

    files = parse_serving(out.stdout.splitlines()).files

    assert files == {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}
    assert any(line.startswith("file \\") for line in out.stdout.splitlines())


def test_the_routers_worker_list_is_read_in_the_same_command(tmp_path: Path) -> None:
    """`router_list`: the router's GET list answer (sglang-router's {"workers": [{"url",
    "is_healthy"}]}, as programs/router_workers.py reads it), served here by a real HTTP server;
    a router that does not answer is an error, not an empty list."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answer = {
        "workers": [
            {"url": "http://127.0.0.1:30000/", "is_healthy": True},
            {"url": "http://127.0.0.1:30001", "is_healthy": False},
        ]
    }

    class Router(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(answer).encode()
            self.send_response(200 if self.path == "/workers" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def read(url: str) -> tuple[dict[str, bool] | None, str | None]:
        command = ServingState().command(
            engine_root=str(tmp_path / "engine"),
            model_link=str(tmp_path / "m"),
            ranks=[],
            router=False,
            router_list=url,
        )
        out = subprocess.run(
            ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
        )
        found = parse_serving(out.stdout.splitlines())
        return found.router_workers, found.router_workers_error

    try:
        assert read(f"{base}/workers") == (
            {"http://127.0.0.1:30000": True, "http://127.0.0.1:30001": False},
            None,
        )
        assert read(f"{base}/nothing") == (None, "HTTPError")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert read(f"{base}/workers") == (None, "URLError")
