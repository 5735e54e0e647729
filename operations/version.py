"""The toolkit's version: pyproject.toml's, and CHANGELOG.md's newest released heading
(tests/unit/test_toolkit_version.py holds the three equal).

A constant, not a file read: the project is not installed as a package (pyproject.toml's
`[tool.uv] package = false`, so importlib.metadata has no version to give), and the plan
(operations/plan/toolkit_version.py), which says what a run's upgrade is, reads no file.
Semantic versioning (https://semver.org/): while the major is 0, a minor release may restart
ranks or move the router, and its CHANGELOG.md entry says so.
"""

VERSION = "0.15.0"
# The date of VERSION's heading in CHANGELOG.md ("## [0.15.0] - 2026-12-07"): its anchor.
RELEASED = "2026-12-07"
CHANGELOG = "CHANGELOG.md"
