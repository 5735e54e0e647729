"""pyinfra operation fixtures, in pyinfra's own style: tests/operations/<module>.<op>/<case>.json
holds the arguments, the facts and the exact commands the operation must yield."""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

BASE_IMPORT_PATH = "operations"
TESTS_BASE = Path(__file__).parent / "operations"

for op_path in sorted(d.name for d in TESTS_BASE.iterdir() if d.is_dir()):
    locals()[op_path] = make_operation_tests(BASE_IMPORT_PATH, op_path, TESTS_BASE / op_path)
