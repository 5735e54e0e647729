#!/usr/bin/env python3
"""Open each GPU device node read-write, as the GpuNodeAccess fact's probe unit runs it
(operations/facts/gpu.py): as the service user, in a rank's sandbox, one `python3 -c` argument
of a transient unit's ExecStart.

    gpu_open.py NODE ...

Prints "open=NODE|ok" or "open=NODE|ERRNO" (EACCES: the node's mode; EPERM: a device filter
that holds) per node. systemd expands specifiers and variables in a transient ExecStart: this
text holds neither character that starts one (tests/unit/test_gpu_access.py).
"""

from __future__ import annotations

import errno
import os
import sys


def opened(node: str) -> str:
    """The errno's name opening `node` read-write gave, or "ok"."""
    try:
        os.close(os.open(node, os.O_RDWR))
    except OSError as error:
        code = error.errno or 0
        return errno.errorcode.get(code, str(error.errno))
    return "ok"


def main(argv: list[str]) -> int:
    for node in argv:
        print("open=" + node + "|" + opened(node))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
