"""Writes this run's counts, when ``RL_SDK_COUNTS`` names a file, as one line
in the form of cargo's summary (``test result: sdk-python. P passed; F
failed; S ignored;``) for the Makefile's total. Failed counts errors too;
ignored counts skips and expected failures."""

from __future__ import annotations

import os
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = os.environ.get("RL_SDK_COUNTS")
    if not path:
        return
    stats = terminalreporter.stats

    def n(*keys: str) -> int:
        return sum(len(stats.get(k, [])) for k in keys)

    with open(path, "a") as f:
        f.write(f"test result: sdk-python. {n('passed')} passed; {n('failed', 'error', 'xpassed')}"
                f" failed; {n('skipped', 'xfailed')} ignored;\n")
