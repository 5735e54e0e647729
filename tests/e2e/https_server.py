"""A file server over HTTPS on loopback, for the tests of what must be fetched over https only
(pve.py's driver installer): a throwaway CA and a server certificate for 127.0.0.1 made with
openssl, `python3 -m http.server`'s handler behind an ssl context, started and stopped by PID.

    with HttpsFiles(tmp, {"NVIDIA-Linux-x86_64-565.57.01.run": data}) as files:
        files.url("NVIDIA-Linux-x86_64-565.57.01.run")  # and trust files.ca_pem where curl runs
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import TracebackType

from tests.e2e.index import START_TIMEOUT_S, _listening, free_port, stop_process, wait_for

SERVER = """
import http.server, functools, ssl, sys
port, root, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class HttpsFiles:
    def __init__(self, work: Path, files: dict[str, bytes]) -> None:
        self.work = work
        self.root = work / "files"
        self.root.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (self.root / name).write_bytes(data)
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def ca_pem(self) -> str:
        return (self.work / "ca.pem").read_text()

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> HttpsFiles:
        w = self.work
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", "/CN=sglang-deploy test CA", "-keyout", "ca.key", "-out", "ca.pem",
                 cwd=w)  # fmt: skip
        (w / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                 "-keyout", "server.key", "-out", "server.csr", cwd=w)  # fmt: skip
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem",
                 cwd=w)  # fmt: skip
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(self.port), str(self.root),
             str(w / "server.pem"), str(w / "server.key")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(w / "https.log").open("ab"),
        )  # fmt: skip
        port = self.port
        wait_for(lambda: _listening(port), START_TIMEOUT_S, f"https on {port}", self._proc)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None
