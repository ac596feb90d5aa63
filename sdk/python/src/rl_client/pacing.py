"""Proactive pacing: slow a batch down before the bucket is empty, from the
``RateLimit`` / ``RateLimit-Policy`` fields, instead of reacting to 429s."""

from __future__ import annotations

import threading
from typing import Optional

from .clock import Clock, SystemClock
from .headers import RateLimitInfo


class Pacer:
    """Spaces requests once the binding bucket runs low.

    While the binding ``RateLimit`` item's ``r`` (points left) stays above a
    reserve, requests go at once. Below it, the pacer waits until the
    bucket's refill (``q / w`` of the binding ``RateLimit-Policy`` item) has
    brought it back to ``reserve + cost``, counting the time since that
    answer: a batch then runs at the refill rate and keeps ``reserve`` points
    for other users of the key. The reserve is ``reserve_ratio`` of the
    bucket's size, at least ``min_reserve`` points; the size is estimated as
    ``r + t * q / w`` (what is left plus what refills until the bucket is
    full), or ``q`` when the item has no ``t``.

    Without a policy rate (no ``q``/``w``) it never waits. ``observe`` takes
    each response's fields (the clients call it); ``delay(cost)`` is the wait
    before the next request; ``wait``/``wait_async`` sleep it. Thread-safe.
    """

    def __init__(
        self,
        *,
        reserve_ratio: float = 0.1,
        min_reserve: float = 1.0,
        clock: Optional[Clock] = None,
    ) -> None:
        if reserve_ratio < 0 or min_reserve < 0:
            raise ValueError("reserve_ratio and min_reserve must be >= 0")
        self.reserve_ratio = reserve_ratio
        self.min_reserve = min_reserve
        self._clock = clock or SystemClock()
        self._mutex = threading.Lock()
        self._info: Optional[RateLimitInfo] = None
        self._seen_at = 0.0

    def observe(self, info: Optional[RateLimitInfo]) -> None:
        """Records the latest fields (None is ignored)."""
        if info is None or info.binding is None:
            return
        with self._mutex:
            self._info, self._seen_at = info, self._clock.monotonic()

    def delay(self, cost: float = 1.0) -> float:
        """Seconds to wait before a request costing ``cost`` points."""
        with self._mutex:
            info, seen_at = self._info, self._seen_at
        if info is None or info.binding is None or info.binding.remaining is None:
            return 0.0
        policy = info.policy_of(info.binding)
        rate = policy.rate if policy is not None else None
        if policy is None or rate is None or rate <= 0 or policy.quota is None:
            return 0.0
        remaining = float(info.binding.remaining)
        # the bucket's size: what is left plus what refills until it is full
        # (t); without t, the policy's quota
        reset = info.binding.reset
        size = remaining + float(reset) * rate if reset is not None else float(policy.quota)
        reserve = max(self.min_reserve, self.reserve_ratio * size)
        short = reserve + cost - remaining
        if short <= 0:
            return 0.0
        elapsed = self._clock.monotonic() - seen_at
        return max(0.0, short / rate - elapsed)

    def wait(self, cost: float = 1.0) -> None:
        """Sleeps :meth:`delay`."""
        self._clock.sleep(self.delay(cost))

    async def wait_async(self, cost: float = 1.0) -> None:
        """Awaits :meth:`delay`."""
        await self._clock.asleep(self.delay(cost))
