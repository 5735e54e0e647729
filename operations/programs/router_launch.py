#!/usr/bin/env python3
"""Start sglang-router with its control-plane key, which never appears on a command line.

The router unit runs, with the router environment's interpreter
(operations/plan/resolver/router.py):

    python router_launch.py sglang_router.launch_router OPTIONS...

and systemd hands the unit the key file as a credential (LoadCredential=, systemd.exec(5)
"Credentials": a copy readable by the unit's user only, in $CREDENTIALS_DIRECTORY). This reads
it there and calls the router's own parser and launcher in this process with OPTIONS plus
`--control-plane-api-keys ID:NAME:admin:KEY`: the key reaches the parser as a list element,
never the process's argv (/proc/PID/cmdline, which every local user can read) or the unit.
sglang-router 0.3.2 has no environment variable or file for it
(src/sglang_router/router_args.py:832-839, `_parse_control_plane_api_keys` at 1028-1049;
launch_router.py:63-105 `parse_router_args(args)` takes the list it parses).

A missing or empty credential is one line on stderr and exit 2: the router does not start
open.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from operations.programs.api_key_file import read_api_key

# layout.CONTROL_PLANE_CREDENTIAL: the unit's LoadCredential= name.
CREDENTIAL = "control-plane-key"
# How the router names the key in its audit log (never the key itself).
KEY_ID = "sglang-deploy"
KEY_NAME = "sglang-deploy drain"


def control_plane_key() -> str:
    directory = os.environ.get("CREDENTIALS_DIRECTORY", "")
    if not directory:
        raise SystemExit(
            f"router_launch: no $CREDENTIALS_DIRECTORY: the unit must load the {CREDENTIAL} "
            "credential (LoadCredential=)"
        )
    try:
        key = (Path(directory) / CREDENTIAL).read_text().strip()
    except OSError as error:
        raise SystemExit(f"router_launch: credential {CREDENTIAL}: {error.strerror}") from None
    if not key:
        raise SystemExit(f"router_launch: credential {CREDENTIAL} is empty")
    return key


# layout.API_KEY_CREDENTIAL: the ranks' API key file (SECRETS_FILE, `api-key: "KEY"`), loaded
# only for smg in front of ranks that want it: smg sends it to them (--api-key) and asks it of
# its own clients, as the ranks do.
API_KEY_CREDENTIAL = "api-key"


def ranks_api_key() -> str | None:
    """The ranks' API key from its credential, or None when the unit loads none."""
    path = Path(os.environ.get("CREDENTIALS_DIRECTORY", "")) / API_KEY_CREDENTIAL
    try:
        return read_api_key(str(path))
    except OSError:
        return None


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: router_launch.py MODULE [OPTIONS...]", file=sys.stderr)
        return 2
    try:
        key = control_plane_key()
    except SystemExit as refused:
        print(refused, file=sys.stderr)
        return 2
    # The router's own module, from the environment this interpreter belongs to (not the
    # host's standard library: this one script runs with the router environment's python).
    router = importlib.import_module(sys.argv[1])
    options = [*sys.argv[2:], "--control-plane-api-keys", f"{KEY_ID}:{KEY_NAME}:admin:{key}"]
    api_key = ranks_api_key()
    if api_key is not None:
        options += ["--api-key", api_key]
    router.launch_router(router.parse_router_args(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
