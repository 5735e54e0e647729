"""The deploy's facts, operations and logic (docs/architecture.md is the map)."""

import sys

# pyinfra's CLI turns bytecode writing off for its whole process (pyinfra_cli/main.py, so that
# deploy and inventory files leave no .pyc beside them), and with it the cache of this package:
# every `pyinfra ... deploy.py` compiled its ~14k lines again, ~85 ms of a converged run
# (bench/serve_bench.py). Our modules are cached as any import is, unless the user asked not to
# (`python -B` or PYTHONDONTWRITEBYTECODE, which both set sys.flags at start).
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)
