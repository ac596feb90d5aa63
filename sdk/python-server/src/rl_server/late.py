"""What the ASGI middleware leaves running after a request is answered.

A Redis call past its deadline was usually sent: Redis may still run it, and
only its reply is late. The middleware lets such a call finish here and then
gives back what it took (a refund, a lease release), as it also gives back
here the charges of a request that failed midway. Bounded: at most ``limit``
pieces of work at once, each done within ``seconds``; past either, the work
is cancelled and logged, and what it took stays spent (points come back
with time, a lease with its ttl)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine, Optional, Set, TypeVar

import redis

T = TypeVar("T")

log = logging.getLogger("rl_server")
#: what a Redis call that failed raises (an error reply is a RedisError too)
REDIS_FAILURES = (redis.RedisError, OSError, asyncio.TimeoutError)


class Background:
    """A bounded set of background tasks (one set per middleware)."""

    def __init__(self, limit: int, seconds: float) -> None:
        #: most pieces of work running at once
        self.limit = limit
        #: most seconds one piece of work runs
        self.seconds = seconds
        self._tasks: Set["asyncio.Task[None]"] = set()

    def __len__(self) -> int:
        """The pieces of work running now."""
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> bool:
        """Runs ``work`` within the bounds; False, ``work`` closed unrun,
        when ``limit`` pieces run already."""
        if len(self._tasks) >= self.limit:
            work.close()
            log.warning("rl: %s dropped: %d pieces of background work running already", what, self.limit)
            return False
        task = asyncio.ensure_future(self._bounded(work, what))
        self._tasks.add(task)  # a reference: the loop keeps only weak ones
        task.add_done_callback(self._tasks.discard)
        return True

    def settle(self, call: "asyncio.Future[T]", undo: Callable[[T], Optional[Awaitable[Any]]],
               what: str) -> None:
        """Lets ``call`` (whose request stopped waiting for it) finish, then
        awaits ``undo`` of its reply (None: nothing to give back). A call
        that failed took nothing; one dropped at the bounds is cancelled."""
        if call.done() and (call.cancelled() or call.exception() is not None):
            return

        async def finish() -> None:
            pending = undo(await call)
            if pending is not None:
                await pending

        if not self.spawn(finish(), what):
            call.cancel()

    async def _bounded(self, work: Coroutine[Any, Any, None], what: str) -> None:
        try:
            # past the bound, wait_for cancels work, and with it the call it awaits
            await asyncio.wait_for(work, self.seconds)
        except asyncio.TimeoutError:
            log.warning("rl: %s dropped: not done within %s s", what, self.seconds)
        except REDIS_FAILURES as err:
            log.warning("rl: %s failed: %s", what, err)
