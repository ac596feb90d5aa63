"""Writes this run's counts line for sdk/test.sh (``test result: sdk-python.
...``; see sdk/e2e/pytest_counts.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))

from pytest_counts import write_counts  # noqa: E402


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write_counts(terminalreporter, "sdk-python")
