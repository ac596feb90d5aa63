"""The time and randomness the retry logic uses, injectable for tests."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Protocol


class Clock(Protocol):
    """Where the SDK reads time and how it waits."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, lockouts, pacing)."""

    def wall(self) -> float:
        """Unix time; used only for an HTTP-date ``Retry-After`` on a response
        without a ``Date`` header."""

    def sleep(self, seconds: float) -> None:
        """Blocks the calling thread for ``seconds``."""

    async def asleep(self, seconds: float) -> None:
        """Suspends the calling task for ``seconds``."""


class Random(Protocol):
    """The one method of :class:`random.Random` the SDK uses."""

    def uniform(self, a: float, b: float) -> float:
        """A number between ``a`` and ``b``."""


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time`,
    :func:`time.sleep` and :func:`asyncio.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)


def system_random() -> Random:
    """A fresh :class:`random.Random` seeded from the OS."""
    return random.Random()
