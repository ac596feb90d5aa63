"""The in-process limiter a route falls back to while Redis fails (its
``on_redis_failure="local"``): a token bucket per key (GCRA, on this
process's monotonic clock) and a count of leases per key. Per process, so
N processes admit up to N times its share: the middleware scales each
limit by ``fallback_ratio``. Bounded: past ``max_keys`` the least recently
used keys are forgotten."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple


@dataclass(frozen=True)
class LocalDecision:
    """A local bucket's answer."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_ms: int


class LocalLimiter:
    """Token buckets and lease counts of one process."""

    def __init__(self, max_keys: int = 10000, clock: Callable[[], float] = time.monotonic) -> None:
        self._tat: "OrderedDict[str, float]" = OrderedDict()
        self._leases: Dict[str, int] = {}
        self._max_keys = max_keys
        self._clock = clock

    def take(self, buckets: Sequence[Tuple[str, int, int, float]], cost: int) -> List[LocalDecision]:
        """``cost`` points from every bucket (key, capacity, tokens, period
        seconds), all-or-nothing: one answer per bucket."""
        now = self._clock()
        plans = []
        for key, capacity, tokens, period in buckets:
            step = period / tokens  # seconds per point
            tat = max(self._tat.get(key, now), now)
            new_tat = tat + cost * step
            wait = new_tat - capacity * step - now
            plans.append((key, capacity, step, tat, new_tat, math.ceil(wait * 1000) if wait > 1e-9 else 0))
        admit = all(p[5] == 0 for p in plans)
        out = []
        for key, capacity, step, tat, new_tat, retry in plans:
            if admit:
                self._tat[key] = tat = new_tat
                self._tat.move_to_end(key)
                if len(self._tat) > self._max_keys:
                    self._tat.popitem(last=False)
            remaining = max(int(capacity - (tat - now) / step + 1e-9), 0)
            out.append(LocalDecision(admit, capacity, remaining, 0 if admit else retry,
                                     math.ceil((tat - now) * 1000)))
        return out

    def acquire(self, key: str, max_leases: int) -> bool:
        """One of ``max_leases`` local slots of ``key``."""
        n = self._leases.get(key, 0)
        if n >= max_leases:
            return False
        self._leases[key] = n + 1
        return True

    def release(self, key: str) -> None:
        """Gives back a local slot of ``key``."""
        n = self._leases.get(key, 0) - 1
        if n <= 0:
            self._leases.pop(key, None)
        else:
            self._leases[key] = n
