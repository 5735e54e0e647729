"""pyinfra fact fixtures, in pyinfra's own style: tests/facts/<module>.<Fact>/<case>.json holds
the command's output and the value the fact must return. One new case is one new file."""

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests

BASE_IMPORT_PATH = "operations.facts"
TESTS_BASE = Path(__file__).parent / "facts"

for fact_path in sorted(d.name for d in TESTS_BASE.iterdir() if d.is_dir()):
    locals()[fact_path] = make_fact_tests(BASE_IMPORT_PATH, fact_path, TESTS_BASE / fact_path)
