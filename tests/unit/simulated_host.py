"""TEST DOUBLE: a host that remembers what a deploy wrote, behind pyinfra's @fake connector.

The real `pyinfra INVENTORY deploy.py` (or the plan command) runs with pyinfra's @fake connector,
whose `run_shell_command` is wrapped here (as tests/unit/test_plan_cli.py's recorder does):

- every file a deploy writes through `host_files.put_file` (a `sh -c` script whose stdin is the
  base64 content, moved onto its destination by `mv -f "$tmp" DEST`) is kept in the image, by
  its sha256: the next run's ServingState fact reads it back, but only for the paths the fact's
  own command names (its `sha256sum -- PATH...`), as GNU sha256sum would: a managed file the
  fact does not ask about is absent to the deploy, as on a real host;
- a rank unit written is loaded and running from then on (the deploy's reload and restart
  follow its write; the e2e tests prove those on real systemd);
- the ServingState answer is composed from the image in the fact's own line format by the
  product's converged host (operations/simulated/converged.py serving_lines, the same
  knowledge `make demo-day2` runs on), the engine environment the plan names complete
  (seeded), the staged copy up to date (seeded, staging_lines: no file left to copy), the
  stage unit enabled;
- the router lists the workers `router_workers.py in` put back, and not those `out` took out
  (the fact's worker list answer, when it asks);
- every command is recorded with the fact that asked for it (None: an operation's).

Run as `python -c RUNNER IMAGE LOG WHAT ARGS...`; IMAGE (JSON) is read and written back.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
from typing import Any

from operations import layout
from operations.simulated.converged import (
    Engine,
    Image,
    StagedCopy,
    serving_lines,
    staging_lines,
)

ENGINE_SIGNATURE = "sed 's/^/engine /'"
_MOVE = re.compile(r"""mv -f "\$tmp" ([^\s;]+)""")
_OWNERS = re.compile(r'chown ([^\s;]+) "\$tmp"; chmod ([^\s;]+) "\$tmp"')
_DIRECTORY = re.compile(r"install -d -m (\S+) -o (\S+) -g (\S+) ([^\s;]+)")
FILE_AT_SIGNATURE = 'stat -c "dir directory'
_FILE_AT = re.compile(r"d=(\S+); f=(\S+); ")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def asked_paths(command: str) -> list[str]:
    """The paths the ServingState command checksums (`sha256sum -- PATH... 2>/dev/null | sed
    's/^/file /'`)."""
    head, found, _ = command.partition(" 2>/dev/null | sed 's/^/file /'")
    if not found:
        return []
    _, found, words = head.rpartition("sha256sum --")
    return shlex.split(words) if found else []


def image_of(image: dict[str, Any]) -> Image:
    """The JSON image as the product's converged host (operations/simulated/converged.py)."""
    engine, staged = image["engine"], image["staging"]
    return Image(
        units=image.get("units", {}),
        files=image["files"],
        engine=Engine(
            engine["name"],
            engine["release"],
            engine["lane"],
            engine["uv"],
            tuple(engine["toolkits"]),
            engine.get("cache_owner", "sglang"),
        ),
        slug=image["slug"],
        key=image["key"],
        staging=StagedCopy(
            staged["digest"],
            staged["bytes"],
            staged["files"],
            staged["models"],
            staged.get("hub_revision"),
        ),
        listed=image.get("listed", []),
        record=image.get("record"),
    )


def serving_answer(image: dict[str, Any], command: str) -> list[str]:
    """The ServingState fact's output on the imaged host (the router unit only when the fact
    asks for it)."""
    return serving_lines(
        image_of(image),
        asked_paths(command),
        router_list="router_workers ok" in command,
        router_unit=layout.ROUTER_UNIT in command,
    )


def file_at_answer(image: dict[str, Any], command: str) -> list[str]:
    """The FileAt fact's output (operations/facts/files.py) for a file the image holds."""
    found = _FILE_AT.search(command)
    if not found:
        return ["end"]
    directory, path = (shlex.split(w)[0] for w in found.groups())
    lines = []
    if directory in image.get("dirs", {}):
        lines.append("dir directory " + " ".join(image["dirs"][directory]))
    if path in image["files"] and path in image.get("meta", {}):
        lines.append("file file " + " ".join(image["meta"][path]))
        lines.append(f"sha256 {image['files'][path]}")
    return [*lines, "end"]


def staging_answer(image: dict[str, Any]) -> list[str]:
    return staging_lines(image_of(image))


def remember(image: dict[str, Any], command: str, stdin: object) -> None:
    """What an operation's command leaves on the imaged host."""
    if f"{layout.ROLL_BATCH_SCRIPT} --batch" in command:
        # roll_batch.py ... STEPS_JSON: each step's argv as its own command, a `write` step
        # with the next line of the batch's stdin (programs/roll_batch.py).
        steps = json.loads(shlex.split(command[command.index(layout.ROLL_BATCH_SCRIPT) :])[-1])
        lines = iter(str(stdin or "").splitlines())
        for name, argv, *_ in steps:
            remember(image, shlex.join(argv), next(lines) if name == "write" else None)
        return
    moved = _MOVE.search(command)
    if moved and isinstance(stdin, str):
        dest = shlex.split(moved.group(1))[0]
        data = base64.b64decode(stdin)
        image["files"][dest] = _sha(data)
        owners = _OWNERS.search(command)
        if owners:
            owner, _, group = shlex.split(owners.group(1))[0].partition(":")
            image.setdefault("meta", {})[dest] = [shlex.split(owners.group(2))[0], owner, group]
        unit = dest.rsplit("/", 1)[-1]
        if dest == layout.unit_path(unit) and layout.rank_of(unit) is not None:
            image.setdefault("units", {})[unit] = data.decode()
        if dest == layout.TOOLKIT_RECORD:
            image["record"] = data.decode()
    if f"{layout.ROUTER_WORKERS_SCRIPT} --router" in command:
        # router_workers.py ... in UNIT=URL...: the router lists them from then on (out:
        # it does not).
        words = shlex.split(command[command.index(layout.ROUTER_WORKERS_SCRIPT) :])
        action = "in" if "in" in words else "out"
        after = words[words.index(action) + 1 :]
        urls = [w.split("=")[1].rstrip("/") for w in after if "=" in w]
        listed = image.setdefault("listed", [])
        for url in urls:
            if action == "in" and url not in listed:
                listed.append(url)
            elif action == "out" and url in listed:
                listed.remove(url)
    for mode, owner, group, directory in _DIRECTORY.findall(command):
        image.setdefault("dirs", {})[shlex.split(directory)[0]] = [mode, owner, group]
    for marker in re.findall(r"touch (\S+)", command):
        path = shlex.split(marker)[0]
        if path.endswith(layout.ROUTER_MARKER):
            image["files"][path] = _sha(b"")


RUNNER = """
import atexit, contextvars, json, sys
from pyinfra.api import facts
from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput, OutputLine
from operations.simulated import converged as conv
from tests.unit import simulated_host as sim

asking = contextvars.ContextVar("asking", default=None)
seen = []
get_fact = facts._get_fact
run = FakeConnector.run_shell_command
image_path, out, what = sys.argv[1], sys.argv[2], sys.argv[3]
images = json.load(open(image_path))

def in_fact(state, host, cls, *args, **kwargs):
    token = asking.set(cls.__name__)
    try:
        return get_fact(state, host, cls, *args, **kwargs)
    finally:
        asking.reset(token)

def command(self, cmd, *args, **kwargs):
    text = cmd if isinstance(cmd, str) else cmd.get_raw_value()
    masked = cmd if isinstance(cmd, str) else cmd.get_masked_value()
    fact = asking.get()
    seen.append([self.host.name, fact, masked])
    image = images[self.host.name]
    answer = None
    if not image["engine"]:
        pass  # not seeded yet: the plain @fake answers (the plan that seeds it)
    elif conv.SERVING_SIGNATURE in text and sim.ENGINE_SIGNATURE in text:
        answer = sim.serving_answer(image, text)
    elif sim.FILE_AT_SIGNATURE in text:
        answer = sim.file_at_answer(image, text)
    elif conv.STAGING_SIGNATURE in text:
        answer = sim.staging_answer(image)
    if fact is None:
        sim.remember(image, text, kwargs.get("_stdin"))
    if answer is not None:
        return True, CommandOutput([OutputLine("stdout", line) for line in answer])
    return run(self, cmd, *args, **kwargs)

def save():
    open(out, "w").write(json.dumps(seen))
    open(image_path, "w").write(json.dumps(images))

facts._get_fact, FakeConnector.run_shell_command = in_fact, command
atexit.register(save)
sys.argv = [what, *sys.argv[4:]]
if what == "plan":
    from operations.cli.plan import main
else:
    from pyinfra_cli.main import main
sys.exit(main())
"""
