"""`make api-key` (`python -m operations.cli.api_key FILE`): the API key clients send, made once
on the controller in FILE with mode 600 before its first byte, never replaced. A file already
there is left as it is (rotating the key is writing a new one into it and deploying: the ranks
restart in batches with it). Prints one line: where the key is, and whether it is new.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

# sk- and 43 URL-safe characters (32 random bytes): what OpenAI clients and SGLang take as-is.
PREFIX = "sk-"


def make_key(path: Path) -> str:
    """The line to print; the key itself is never printed."""
    if path.exists():
        return f"api-key: {path} is already there; kept (a new key: write it there, then deploy)"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = PREFIX + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return f"api-key: {path}: a new key (mode 600); clients send it as 'Authorization: Bearer KEY'"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m operations.cli.api_key FILE", file=sys.stderr)
        return 2
    try:
        print(make_key(Path(argv[0])))
    except OSError as exc:
        print(f"api-key: {argv[0]}: cannot be written on the controller: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
