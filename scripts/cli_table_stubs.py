# mypy: ignore-errors
# (Stand-ins are dynamic by nature: this file runs only in the child `python -I -S`.)
"""Runs in a child `python -I -S`: builds one release's real argparse parser from its unpacked
wheel with no torch, no CUDA and none of the release's heavy requirements installed.

Usage (by scripts/gen_cli_table.py, never by hand)::

    python -I -S cli_table_stubs.py MODULE CLASS STUBS SRC LIGHT VERSIONS

Only the modules named in STUBS (comma-separated top-level names: the ones whose import failed
with ModuleNotFoundError, added one at a time by the parent) are replaced by stand-ins; every
other import is the real thing (the release's own code from SRC, the small pure packages the
parent put in LIGHT, the standard library) or is absent (an optional probe such as
`importlib.util.find_spec("torch_npu")` answers None, as on a plain machine). A stand-in
behaves as a machine without a GPU does: every attribute exists and is falsy, calls return the
stand-in (a call with one function is a decorator and returns the function),
`triton.runtime.driver.active` raises (triton has no active driver without a GPU), the vendor
namespaces `torch.npu/hpu/mlu/musa` are absent, and a module's `__version__` is the version
the release pins with `==` (VERSIONS, a JSON object by module name), so version gates read what
the release would meet. The parser, its options, dests, actions and choices are sglang's own:
nothing of sglang is patched. The parent checks the method by rebuilding committed tables
(tests/unit/test_cli_tables.py).

Prints the parser's raw actions as JSON on stdout.
"""

import abc
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

# The parser's raw actions, as the virtualenv method reads them (its directory is not on the
# path under -I).
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from cli_table_actions import actions

STUBS = {name for name in sys.argv[3].split(",") if name}
VERSIONS = json.loads(sys.argv[6])

# Attributes Python's own machinery probes (inspect, dataclasses, typing, copy, import): a
# stand-in must not pretend to have them.
_PROBED = {
    "__wrapped__", "__signature__", "__origin__", "__args__", "__parameters__", "__path__",
    "__file__", "__spec__", "__loader__", "__all__", "__set_name__", "__get__", "__set__",
    "__delete__", "__dataclass_fields__", "__isabstractmethod__", "__annotations__",
    "__orig_bases__", "__copy__", "__deepcopy__", "__reduce_ex__", "__getstate__",
    "__length_hint__", "__class_getitem__", "__self__", "__code__", "__text_signature__",
    "__mro_entries__", "__iter__", "__len__",
}  # fmt: skip
_NO_GPU = {"active"}  # triton.runtime.driver.active raises without a GPU driver
_ABSENT = {"npu", "hpu", "mlu", "musa"}  # torch.<vendor>: only their plugins add them


class _Meta(abc.ABCMeta):
    def __getattr__(cls, name):
        if name in _PROBED or name in _NO_GPU or name.startswith(("_pytest", "_abc")):
            raise AttributeError(name)
        return _Stub

    def __new__(mcls, name, bases, ns, **kw):
        return super().__new__(mcls, name, bases, ns)

    def __init__(cls, name, bases, ns, **kw):
        super().__init__(name, bases, ns)

    def __call__(cls, *a, **k):
        if cls is not _Stub:
            return type.__call__(cls, *a, **k)  # a class of sglang's own deriving a stand-in
        if len(a) == 1 and callable(a[0]) and not k and not isinstance(a[0], _Meta):
            return a[0]  # used as a decorator: keep the function
        return cls

    def register(cls, *a, **k):
        if cls is _Stub:
            return a[-1] if a else cls
        return abc.ABCMeta.register(cls, *a)

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, item, value):
        pass

    def __bool__(cls):
        return False

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __lt__(cls, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __mro_entries__(cls, bases):
        return (object,)

    def __int__(cls):
        return 0

    __index__ = __int__

    def __float__(cls):
        return 0.0

    def __str__(cls):
        return "0"

    def __fspath__(cls):
        return "/nonexistent"

    def __contains__(cls, item):
        return False

    def __enter__(cls):
        return cls

    def __exit__(cls, *exc):
        return False

    def __hash__(cls):
        return id(cls)

    def __eq__(cls, other):
        return cls is other


class _Stub(metaclass=_Meta):
    def __init_subclass__(cls, **kw):
        pass

    def __init__(self, *a, **k):
        pass


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name in _PROBED or name in _ABSENT:
            raise AttributeError(name)
        return _Stub


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in STUBS:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = VERSIONS.get(spec.name, "0")
        return module

    def exec_module(self, module):
        pass


def main():
    module_name, class_name, src, light = sys.argv[1], sys.argv[2], sys.argv[4], sys.argv[5]
    sys.path[:0] = [src, light]
    sys.meta_path.insert(0, _Finder())
    cls = getattr(importlib.import_module(module_name), class_name)
    json.dump(actions(cls), sys.stdout)


main()
