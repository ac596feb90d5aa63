"""A storage for ``limits`` (and so for slowapi and flask-limiter) backed by
rl: one rl command per hit, decided inside Redis, exact under concurrency.

Importing this module registers the URI schemes ``rl://host:port[/db]``,
``rls://`` (TLS) and ``rl+cluster://host:port[,host:port...]``, and their
asyncio twins ``async+rl://``, ``async+rls://``, ``async+rl+cluster://``.

How each strategy maps onto rl (all on one key per limit, ``LIMITS-rl:<key>``):

- fixed window: ``incr`` is ``RL.WINDOW key 10^15 expiry FIXED COST amount``,
  whose reply says the count (every hit counts, as limits' own Redis
  storage does; the window's boundaries are rl's per-key schedule);
- moving window: ``RL.WINDOW key limit expiry EXACT COST amount`` (rl's
  sliding log, limits up to 10000);
- sliding window counter: ``RL.WINDOW key limit expiry COST amount``: rl
  weighs the previous window rounded up, so it never admits more than
  limits' formula (at most one point fewer).

``COST 1``, rl's default, is left out (a hit of one sends two arguments fewer).
Each command is sent at most once (``rl_server.send_once``): a hit whose
reply is late is not sent again by redis-py's retries and counted twice.
``get`` and ``get_expiry`` need the window length: they read it from the
key limits makes (``.../<multiples>/<granularity>``), or from this storage's
own earlier hits on the key.
"""

from __future__ import annotations

import functools
import time
import urllib.parse
from collections import OrderedDict
from typing import Any, List, Mapping, Optional, Tuple

import redis
import redis.asyncio as aioredis
from limits.aio.storage import MovingWindowSupport as AsyncMovingWindowSupport
from limits.aio.storage import SlidingWindowCounterSupport as AsyncSlidingWindowCounterSupport
from limits.aio.storage import Storage as AsyncStorage
from limits.errors import ConfigurationError
from limits.limits import TIME_TYPES
from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage

from . import commands, decisions
from .commands import Arg
from .send_once import send_once, send_once_async

#: the limit of the fixed window's counter: every hit is admitted by rl and
#: the count is read from the reply (``10^15 - remaining``)
COUNTER = commands.MAX_POINTS
#: the prefix of the storage's keys: not limits' own ``LIMITS``, so that an
#: app moving from ``redis://`` to ``rl://`` on the same server never meets
#: the string keys its old storage left (rl answers WRONGTYPE on those)
KEY_PREFIX = "LIMITS-rl"
#: the largest moving-window limit (rl's EXACT log)
EXACT_MAX = 10000
_KNOWN_MAX = 10000


@functools.lru_cache(maxsize=4096)
def _window_in_key(key: str) -> Optional[int]:
    """The window (seconds) a key made by limits says (``.../<multiples>/<granularity>``)."""
    parts = key.rsplit("/", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2] in TIME_TYPES:
        return int(parts[1]) * TIME_TYPES[parts[2]].seconds
    return None


class _Windows:
    """The parts shared by the sync and asyncio storages: keys, commands and
    the window lengths of keys, from limits' key format or earlier hits."""

    def __init__(self, key_prefix: str) -> None:
        self.key_prefix = key_prefix
        self._expiries: "OrderedDict[str, int]" = OrderedDict()

    def key(self, key: str) -> str:
        return f"{self.key_prefix}:{key}"

    def remember(self, key: str, expiry: int) -> None:
        self._expiries[key] = expiry
        self._expiries.move_to_end(key)
        if len(self._expiries) > _KNOWN_MAX:
            self._expiries.popitem(last=False)

    def expiry_of(self, key: str) -> int:
        """The window length of ``key``: from limits' key (``.../multiples/granularity``)
        or from a hit this storage made on it."""
        in_key = _window_in_key(key)
        if in_key is not None:
            return in_key
        known = self._expiries.get(key)
        if known is None:
            raise ConfigurationError(
                f"rl storage: the window of {key!r} is unknown (not a key made by limits "
                "and not hit through this storage)")
        return known

    def _args(self, key: str, limit: int, expiry: int, amount: int, mode: Optional[str]) -> Tuple[Arg, ...]:
        # the hot path: limits passes whole seconds and points; anything else
        # goes through the builder, which names what is wrong
        if type(limit) is int and type(expiry) is int and type(amount) is int \
                and 1 <= limit <= COUNTER and 0 < expiry <= commands.MAX_SECONDS and 0 <= amount <= COUNTER:
            args: Tuple[Arg, ...] = ("RL.WINDOW", f"{self.key_prefix}:{key}", limit, expiry)
            if amount != 1:  # 1 is rl's default COST
                args += ("COST", amount)
            return args + (mode,) if mode else args
        return commands.window(commands.Window(self.key(key), limit, expiry), cost=amount, mode=mode).args

    def fixed(self, key: str, expiry: int, amount: int) -> Tuple[Arg, ...]:
        if _window_in_key(key) is None:
            self.remember(key, expiry)  # get() could not read its window from the key
        return self._args(key, COUNTER, expiry, amount, "FIXED")

    def exact(self, key: str, limit: int, expiry: int, amount: int) -> Tuple[Arg, ...]:
        if limit > EXACT_MAX:
            raise ConfigurationError(
                f"rl storage: the moving window holds at most {EXACT_MAX} entries (limit {limit}); "
                "use the sliding-window-counter or fixed-window strategy")
        return self._args(key, limit, expiry, amount, "EXACT")

    def sliding(self, key: str, limit: int, expiry: int, amount: int) -> Tuple[Arg, ...]:
        return self._args(key, limit, expiry, amount, None)

    @staticmethod
    def oldest_probe(count: int) -> Optional[int]:
        """The limit of a second probe whose wait says when the oldest entry
        leaves (None: one entry, whose end is ``reset_ms``)."""
        return count - 1 if count > 1 else None

    @staticmethod
    def window_start(expiry: int, oldest_end_ms: int) -> float:
        return time.time() + oldest_end_ms / 1000 - expiry


def _parse_uri(uri: str) -> Tuple[str, bool, List[Tuple[str, int]]]:
    """(redis URL, cluster?, nodes) of an rl URI."""
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.removeprefix("async+")
    rest = uri.split("://", 1)[1]
    if scheme == "rl+cluster":
        nodes = []
        for loc in parsed.netloc.rsplit("@", 1)[-1].split(","):
            host, _, port = loc.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ConfigurationError(f"rl storage: bad cluster node {loc!r} in {uri}")
            nodes.append((host, int(port)))
        return "", True, nodes
    return ("rediss://" if scheme == "rls" else "redis://") + rest, False, []


def _client(uri: str, single: Any, cluster: Any, node: Any, options: Mapping[str, Any]) -> Any:
    """The redis-py client (``single`` or ``cluster``, sync or asyncio) of an rl URI."""
    url, is_cluster, nodes = _parse_uri(uri)
    if not is_cluster:
        return single.from_url(url, **options)
    parsed = urllib.parse.urlparse(uri)
    auth: dict[str, Any] = {}
    if parsed.username:
        auth["username"] = urllib.parse.unquote(parsed.username)
    if parsed.password:
        auth["password"] = urllib.parse.unquote(parsed.password)
    return cluster(startup_nodes=[node(h, p) for h, p in nodes], **auth, **options)


class RLStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport):
    """The ``rl://`` storage (sync): every limits strategy, one rl command per hit."""

    STORAGE_SCHEME = ["rl", "rls", "rl+cluster"]

    def __init__(self, uri: str, key_prefix: str = KEY_PREFIX, wrap_exceptions: bool = False,
                 **options: Any) -> None:
        """``options`` go to redis-py's client (``socket_timeout`` ...)."""
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        self.windows = _Windows(key_prefix)
        self.client: Any = _client(uri, redis.Redis, redis.RedisCluster, redis.cluster.ClusterNode, options)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return redis.RedisError

    def _send(self, args: Tuple[Arg, ...]) -> object:
        return send_once(self.client, args, args[1])

    def _decide(self, args: Tuple[Arg, ...]) -> decisions.Decision:
        return decisions.decision(self._send(args))

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return COUNTER - decisions.remaining(self._send(self.windows.fixed(key, expiry, amount)))

    def get(self, key: str) -> int:
        return COUNTER - decisions.remaining(self._send(self.windows.fixed(key, self.windows.expiry_of(key), 0)))

    def get_expiry(self, key: str) -> float:
        d = self._decide(self.windows.fixed(key, self.windows.expiry_of(key), 0))
        return time.time() + d.reset_ms / 1000

    def check(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def reset(self) -> int | None:
        n = 0
        for k in self.client.scan_iter(match=f"{self.windows.key_prefix}:*", count=1000):
            n += int(self.client.delete(k))
        return n

    def clear(self, key: str) -> None:
        self.client.delete(self.windows.key(key))

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        return decisions.admitted(self._send(self.windows.exact(key, limit, expiry, amount)))

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        d = self._decide(self.windows.exact(key, EXACT_MAX, expiry, 0))
        count = EXACT_MAX - d.remaining
        if count == 0:
            return time.time(), 0
        second = self.windows.oldest_probe(count)
        end = d.reset_ms if second is None else \
            self._decide(self.windows.exact(key, second, expiry, 0)).retry_after_ms
        return self.windows.window_start(expiry, end), count

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        return decisions.admitted(self._send(self.windows.sliding(key, limit, expiry, amount)))

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        d = self._decide(self.windows.sliding(key, COUNTER, expiry, 0))
        return 0, 0.0, COUNTER - d.remaining, d.reset_ms / 1000

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self.clear(key)


class AsyncRLStorage(AsyncStorage, AsyncMovingWindowSupport, AsyncSlidingWindowCounterSupport):
    """The ``async+rl://`` storage (asyncio): the same commands as ``RLStorage``."""

    STORAGE_SCHEME = ["async+rl", "async+rls", "async+rl+cluster"]

    def __init__(self, uri: str, key_prefix: str = KEY_PREFIX, wrap_exceptions: bool = False,
                 **options: Any) -> None:
        """``options`` go to redis.asyncio's client."""
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        self.windows = _Windows(key_prefix)
        self.client: Any = _client(uri, aioredis.Redis, aioredis.RedisCluster,
                                   aioredis.cluster.ClusterNode, options)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return redis.RedisError

    async def _send(self, args: Tuple[Arg, ...]) -> object:
        return await send_once_async(self.client, args, args[1])

    async def _decide(self, args: Tuple[Arg, ...]) -> decisions.Decision:
        return decisions.decision(await self._send(args))

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return COUNTER - decisions.remaining(await self._send(self.windows.fixed(key, expiry, amount)))

    async def get(self, key: str) -> int:
        return COUNTER - decisions.remaining(await self._send(self.windows.fixed(key, self.windows.expiry_of(key), 0)))

    async def get_expiry(self, key: str) -> float:
        d = await self._decide(self.windows.fixed(key, self.windows.expiry_of(key), 0))
        return time.time() + d.reset_ms / 1000

    async def check(self) -> bool:
        try:
            return bool(await self.client.ping())
        except redis.RedisError:
            return False

    async def reset(self) -> int | None:
        n = 0
        async for k in self.client.scan_iter(match=f"{self.windows.key_prefix}:*", count=1000):
            n += int(await self.client.delete(k))
        return n

    async def clear(self, key: str) -> None:
        await self.client.delete(self.windows.key(key))

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        return decisions.admitted(await self._send(self.windows.exact(key, limit, expiry, amount)))

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        d = await self._decide(self.windows.exact(key, EXACT_MAX, expiry, 0))
        count = EXACT_MAX - d.remaining
        if count == 0:
            return time.time(), 0
        second = self.windows.oldest_probe(count)
        end = d.reset_ms if second is None else \
            (await self._decide(self.windows.exact(key, second, expiry, 0))).retry_after_ms
        return self.windows.window_start(expiry, end), count

    async def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int,
                                           amount: int = 1) -> bool:
        if amount > limit:
            return False
        return decisions.admitted(await self._send(self.windows.sliding(key, limit, expiry, amount)))

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        d = await self._decide(self.windows.sliding(key, COUNTER, expiry, 0))
        return 0, 0.0, COUNTER - d.remaining, d.reset_ms / 1000

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        await self.clear(key)
