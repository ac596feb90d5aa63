"""The counts line of a Python SDK's pytest run for sdk/test.sh: when
``RL_SDK_COUNTS`` names a file, one line in the form of cargo's summary
(``test result: <label>. P passed; F failed; S ignored;``) is appended for
the Makefile's total. Failed counts errors too; ignored counts skips and
expected failures. Standard library only."""

from __future__ import annotations

import os
from typing import Any


def write_counts(terminalreporter: Any, label: str) -> None:
    """Appends this run's counts line, labelled ``label``."""
    path = os.environ.get("RL_SDK_COUNTS")
    if not path:
        return
    stats = terminalreporter.stats

    def n(*keys: str) -> int:
        return sum(len(stats.get(k, [])) for k in keys)

    with open(path, "a") as f:
        f.write(f"test result: {label}. {n('passed')} passed; {n('failed', 'error', 'xpassed')}"
                f" failed; {n('skipped', 'xfailed')} ignored;\n")
