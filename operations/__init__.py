"""The deploy's facts, operations and logic (docs/how-it-works/architecture.md is the map)."""

import sys

# pyinfra's CLI turns bytecode writing off for its whole process (pyinfra_cli/main.py, so that
# deploy and inventory files leave no .pyc beside them; tests/unit/test_pyinfra_contract.py),
# and with it the cache of this package: without this line, every `pyinfra ... deploy.py` after
# a checkout or a pull compiles this package's ~17k lines again (a converged deploy's 75-95 ms,
# bench/README.md), and the knowledge base's kept build (operations/kb/loader.py) and the host
# programs' bundles (operations/render/host_scripts.py), written only where bytecode is, are
# never kept. Our modules are cached as any import is, unless the user asked not to (`python -B`
# or PYTHONDONTWRITEBYTECODE, which both set sys.flags at start).
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)
