"""A roll batch's waiting interpreter (roll_batch.py): started with the batch, it imports the
step's preload and compiles its script, then waits; told GO on its stdin, it runs the script as
`python SCRIPT ARGS` would, and exits without an interpreter's teardown. Told anything else
(its stdin closed: the batch stopped first), it ends with status 125.

roll_batch.py starts it as `PYTHON roll_batch.py --wait SCRIPT PRELOAD ARGS...` (PRELOAD: module
names, comma-separated), so the text that runs is the one shipped with the batch.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
import types
from typing import NoReturn

GO = b"go\n"
NOT_TOLD = 125  # the exit status when the step never came


def _preload(modules: list[str]) -> None:
    for module in modules:
        with contextlib.suppress(ImportError):  # the script says what is missing, when it runs
            importlib.import_module(module)


def _compiled(script: str) -> types.CodeType | BaseException:
    """The script's code; the error when it cannot be read or compiled (said when its step
    comes, as python would say it). Compiled with the script's own future flags, not these."""
    try:
        with open(script, "rb") as source:
            return compile(source.read(), script, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError) as error:
        return error


def _run(code: types.CodeType, script: str) -> int:
    """Run `code` as the __main__ module: its exit status, as python's."""
    main = types.ModuleType("__main__")
    main.__file__ = script
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return int(done.code or 0)
        print(done.code, file=sys.stderr)
        return 1
    except BaseException:  # what python prints for an uncaught error, and exit 1
        traceback.print_exc()
        return 1
    return 0


def wait_for_go(argv: list[str]) -> NoReturn:
    """argv: SCRIPT PRELOAD ARGS..."""
    script, preload, args = argv[0], [m for m in argv[1].split(",") if m], argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
    _preload(preload)
    code = _compiled(script)
    if sys.stdin.buffer.readline() != GO:
        sys.exit(NOT_TOLD)
    if isinstance(code, BaseException):
        print(f"{sys.executable}: can't run {script!r}: {code}", file=sys.stderr)
        os._exit(2)
    sys.argv = [script, *args]
    kept = sys.modules.get("__main__")  # this text's own module, while it runs
    status = _run(code, script)
    sys.stdout.flush()
    sys.stderr.flush()
    del kept
    os._exit(status)  # its work is done: no interpreter teardown on the batch's time
