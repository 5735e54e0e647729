"""What a test needs from the machine it runs on: skipped where it is missing on a developer's
machine, a failure where CI=true (CI's machine must have it: a skip there would hide the test)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"{reason}, and CI=true: refusing to skip", pytrace=False)
    pytest.skip(reason)
