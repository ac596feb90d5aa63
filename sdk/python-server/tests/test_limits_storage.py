"""The rl storage under limits' own strategies, as limits documents them:
fixed window, moving window and sliding window counter, sync and asyncio,
registered URI schemes, and 50 concurrent clients never admitted beyond
the limit."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List

import pytest
import redis
from limits import RateLimitItemPerMinute, RateLimitItemPerSecond, parse
from limits.aio import strategies as aio_strategies
from limits.errors import ConfigurationError
from limits.storage import storage_from_string
from limits.strategies import STRATEGIES

import rl_server.limits_storage  # noqa: F401  (registers rl://)
from rl_server.limits_storage import AsyncRLStorage, RLStorage
from servers import RedisServer, avoid_boundary


@pytest.fixture
def storage(server: RedisServer) -> RLStorage:
    s = storage_from_string(f"rl://127.0.0.1:{server.port}")
    assert isinstance(s, RLStorage)
    s.reset()
    return s


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_strategy_hit_test_stats_clear(storage: RLStorage, strategy: str) -> None:
    limiter = STRATEGIES[strategy](storage)
    item = RateLimitItemPerMinute(5)
    if strategy == "fixed-window":  # the calls below fall in one window
        for user in ("u1", "u2", "u3"):
            avoid_boundary(f"LIMITS-rl:{item.key_for(user)}", 60, margin_s=3)
    assert limiter.test(item, "u1")
    assert [limiter.hit(item, "u1") for _ in range(7)] == [True] * 5 + [False] * 2
    assert not limiter.test(item, "u1")
    stats = limiter.get_window_stats(item, "u1")
    assert stats.remaining == 0 and time.time() < stats.reset_time <= time.time() + 121
    assert limiter.hit(item, "u2", cost=5) and not limiter.hit(item, "u2")
    assert not limiter.hit(item, "u3", cost=6)  # above the limit: never
    limiter.clear(item, "u1")
    assert limiter.test(item, "u1") and limiter.get_window_stats(item, "u1").remaining == 5
    assert limiter.hit(item, "u1", cost=2) and limiter.get_window_stats(item, "u1").remaining == 3


def test_fixed_window_contract(storage: RLStorage) -> None:
    assert storage.incr("k/1/minute", 60) == 1
    assert storage.incr("k/1/minute", 60, amount=4) == 5
    assert storage.get("k/1/minute") == 5
    assert time.time() < storage.get_expiry("k/1/minute") <= time.time() + 60
    assert storage.incr("plain", 3600) == 1 and storage.get("plain") == 1  # a key limits did not make
    storage.clear("k/1/minute")
    assert storage.get("k/1/minute") == 0
    assert storage.check()
    assert storage.reset() == 1  # "plain" is left
    with pytest.raises(ConfigurationError, match="unknown"):
        storage.get("never-seen")


def test_fixed_window_resets_at_its_boundary(storage: RLStorage) -> None:
    limiter = STRATEGIES["fixed-window"](storage)
    item = RateLimitItemPerSecond(2, 2)
    # start early in a window (the key's boundaries are fixed), so that the
    # calls below fall in the same one even on a slow machine
    for _ in range(3):
        limiter.clear(item, "b")
        limiter.hit(item, "b")
        first_reset = limiter.get_window_stats(item, "b").reset_time
        if first_reset - time.time() >= 1.2:
            break
        time.sleep(max(first_reset - time.time(), 0) + 0.01)
    limiter.hit(item, "b")
    reset = limiter.get_window_stats(item, "b").reset_time
    assert not limiter.hit(item, "b")
    time.sleep(max(reset - time.time(), 0) + 0.05)
    assert limiter.hit(item, "b")


def test_moving_window_start_is_the_oldest_entry(storage: RLStorage) -> None:
    limiter = STRATEGIES["moving-window"](storage)
    item = RateLimitItemPerMinute(3)
    t0 = time.time()
    limiter.hit(item, "m")
    time.sleep(0.3)
    limiter.hit(item, "m")
    start, count = storage.get_moving_window(item.key_for("m"), 3, 60)
    assert count == 2 and t0 - 0.05 <= start <= t0 + 0.1
    with pytest.raises(ConfigurationError, match="10000"):
        limiter.hit(parse("20000/minute"), "m2")


def test_sliding_window_counts_the_previous_window(storage: RLStorage) -> None:
    limiter = STRATEGIES["sliding-window-counter"](storage)
    item = RateLimitItemPerSecond(4)
    # early in a second of the key, so that the read 1.05 s later falls in
    # the next one, not the one after
    avoid_boundary(f"LIMITS-rl:{item.key_for('s')}", 1, margin_s=0.5)
    assert all(limiter.hit(item, "s") for _ in range(4))
    time.sleep(1.05)  # the previous second still weighs on this one
    assert limiter.get_window_stats(item, "s").remaining < 4


def test_registered_schemes(server: RedisServer) -> None:
    for uri in (f"rl://127.0.0.1:{server.port}", f"rl://127.0.0.1:{server.port}/0"):
        assert isinstance(storage_from_string(uri), RLStorage)
    assert isinstance(storage_from_string(f"async+rl://127.0.0.1:{server.port}"), AsyncRLStorage)


def test_cluster_storage(cluster: List[RedisServer]) -> None:
    nodes = ",".join(f"127.0.0.1:{n.port}" for n in cluster)
    s = storage_from_string(f"rl+cluster://{nodes}")
    limiter = STRATEGIES["moving-window"](s)
    item = RateLimitItemPerMinute(2)
    for i in range(10):  # keys on every node
        assert [limiter.hit(item, f"user{i}") for _ in range(3)] == [True, True, False]
    assert s.reset() == 10

    async def main() -> bool:
        a = storage_from_string(f"async+rl+cluster://{nodes}")
        return await aio_strategies.STRATEGIES["fixed-window"](a).hit(item, "async-user")

    assert asyncio.run(main())


def test_storage_errors_wrapped_on_request() -> None:
    from limits.errors import StorageError
    s = storage_from_string("rl://127.0.0.1:1", wrap_exceptions=True)
    with pytest.raises(StorageError):
        s.incr("k", 1)
    assert not s.check()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_50_concurrent_clients_never_beyond_the_limit(server: RedisServer, strategy: str) -> None:
    item = RateLimitItemPerMinute(30)
    if strategy != "moving-window":  # the burst within one window (see avoid_boundary)
        avoid_boundary("LIMITS-rl:" + item.key_for(f"c-{strategy}"), 60)
    admitted: List[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(50)

    def client() -> None:
        limiter = STRATEGIES[strategy](storage_from_string(f"rl://127.0.0.1:{server.port}"))
        start.wait(10)
        mine = [limiter.hit(item, f"c-{strategy}") for _ in range(3)]
        with lock:
            admitted.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(admitted) == 150 and admitted.count(True) == 30


@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window", "sliding-window-counter"])
def test_async_storage(server: RedisServer, strategy: str) -> None:
    async def main() -> List[bool]:
        s = storage_from_string(f"async+rl://127.0.0.1:{server.port}")
        await s.reset()  # type: ignore[misc]
        limiter = aio_strategies.STRATEGIES[strategy](s)
        item = RateLimitItemPerMinute(10)
        if strategy == "fixed-window":  # the burst falls in one window
            avoid_boundary(f"LIMITS-rl:{item.key_for('a')}", 60, margin_s=3)
        out = await asyncio.gather(*(limiter.hit(item, "a") for _ in range(25)))
        stats = await limiter.get_window_stats(item, "a")
        assert stats.remaining == 0 and not await limiter.test(item, "a")
        await limiter.clear(item, "a")
        assert await limiter.test(item, "a")
        return list(out)

    assert asyncio.run(main()).count(True) == 10


def test_one_command_per_hit(server: RedisServer, storage: RLStorage) -> None:
    c = redis.Redis(port=server.port)
    c.config_resetstat()
    for strategy in STRATEGIES:
        STRATEGIES[strategy](storage).hit(RateLimitItemPerMinute(10), strategy)
    calls = {k: v["calls"] for k, v in c.info("commandstats").items() if "config" not in k}
    assert calls == {"cmdstat_rl.window": 3}, calls


def test_moving_from_limits_redis_storage_on_the_same_server(server: RedisServer) -> None:
    """The keys limits' own Redis storage left do not meet rl's."""
    item = RateLimitItemPerMinute(3)
    old = STRATEGIES["fixed-window"](storage_from_string(f"redis://127.0.0.1:{server.port}"))
    assert old.hit(item, "moving")
    new = STRATEGIES["fixed-window"](storage_from_string(f"rl://127.0.0.1:{server.port}"))
    assert [new.hit(item, "moving") for _ in range(4)] == [True, True, True, False]
