"""Steady client load through the router for the roll tests and the serve bench: CLIENTS
threads of this process sending OpenAI chat requests back to back on loopback, bounded in count
(MAX_REQUESTS) and in time (each request REQUEST_TIMEOUT_S; stopped by the caller), counting
every answer and every failure (an error status, no answer, or a 200 whose body is not the
model's answer)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

from tests.e2e.index import wait_for

MODEL = "Qwen/Qwen3.6-27B"
CLIENTS = 4
MAX_REQUESTS = 20000  # a bound on the load, whatever happens
REQUEST_TIMEOUT_S = 60
RETRY_PAUSE_S = 0.05


@dataclass
class Load:
    """CLIENTS threads sending chat requests back to back through the router until stopped."""

    url: str
    # The ranks' API key, sent as a client does (Authorization: Bearer); None: none asked.
    key: str | None = None
    statuses: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # When each failed request was sent and answered (time.monotonic()).
    failed_at: list[tuple[float, float]] = field(default_factory=list)

    @property
    def sent(self) -> int:
        with self.lock:
            return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        with self.lock:
            return len(self.failures)

    def _one(self) -> bool:
        """One request; whether it was answered well."""
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        request = urllib.request.Request(
            f"{self.url}/v1/chat/completions", data=body.encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                answer = json.loads(response.read())
                status = str(response.status)
                good = answer["choices"][0]["message"]["content"] and answer["model"] == MODEL
                why = "" if good else f"200 with a wrong body: {answer}"
        except urllib.error.HTTPError as error:
            status, why = str(error.code), f"{error.code} {error.read()[:200]!r}"
        except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
            status, why = "error", repr(error)
        with self.lock:
            self.statuses[status] += 1
            if why:
                self.failures.append(why)
                self.failed_at.append((sent, time.monotonic()))
        return not why

    def _client(self) -> None:
        while not self.stop.is_set() and self.sent < MAX_REQUESTS:
            if not self._one():
                # A client retries a refused request after a pause, as a real one does (a
                # refused connection answers at once: without it the bound is spent in a second).
                self.stop.wait(RETRY_PAUSE_S)

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]
        for thread in self.threads:
            thread.start()
        wait_for(lambda: self.sent >= CLIENTS, timeout=60, what="the load's first answers")
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=REQUEST_TIMEOUT_S + 5)

    def window_s(self) -> float:
        """From the first failed request's send to the last one's answer: the span in which
        clients saw failures (0 when none failed)."""
        with self.lock:
            if not self.failed_at:
                return 0.0
            return max(a for _, a in self.failed_at) - min(s for s, _ in self.failed_at)

    def report(self, what: str) -> str:
        return (
            f"{what}: {self.sent} requests sent by {CLIENTS} clients, {self.failed} failed "
            f"{dict(self.statuses)}; first failures: {self.failures[:5]}"
        )
