"""deploy.py made known to `inspect`, which pyinfra's CLI asks about it for every operation.

pyinfra's CLI orders operations by where deploy code calls them: each operation call reads the
whole call stack (`inspect.stack()`, pyinfra/api/util.py) and looks every frame's file up among
the modules in sys.modules. deploy.py is run with `exec`, not imported: no module names its
file, so each lookup of its frame scans every loaded module again (three a call). A converged
four-host deploy makes about seventy operation calls: the scans cost ~100 ms there, a third of
pyinfra's stack reading (bench/serve_bench.py). A module entry that names the file lets the
first scan remember it; the order pyinfra computes is the same.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types


def known_to_inspect(filename: str) -> str:
    """Register `filename` (a deploy file pyinfra runs) under a module name of its own, once;
    returns that name."""
    path = os.path.abspath(filename)
    name = f"_pyinfra_deploy_file_{hashlib.sha256(path.encode()).hexdigest()[:16]}"
    if name not in sys.modules:
        module = types.ModuleType(
            name, f"{path}, as pyinfra runs it (operations/runtime/stack_order.py)"
        )
        module.__file__ = path
        sys.modules[name] = module
    return name
