"""Typed rl commands on redis-py clients: ``RL`` for ``redis.Redis`` and
``redis.RedisCluster``, ``AsyncRL`` for their asyncio twins. Each method
takes the arguments of the builder of the same name in ``rl_server.commands``
and returns its typed decision; in a cluster each call goes to the node of
its keys (rl declares them, so redis-py routes it like any keyed command).

A command that changes something is sent at most once (``send_once``): a
timeout or a dropped connection after it was sent is raised, never sent
again, since a command that ran would be charged twice. The read-only ones
(``lease_list``, ``box_status``) go through the client's ``execute_command``
and its retries."""

from __future__ import annotations

import sys
from typing import Any, Awaitable, Callable, TypeVar

from . import commands
from .commands import Command
from .send_once import send_once, send_once_async

if sys.version_info >= (3, 10):
    from typing import Concatenate, ParamSpec
else:  # pragma: no cover
    from typing_extensions import Concatenate, ParamSpec

P = ParamSpec("P")
T = TypeVar("T")


def _sync(builder: Callable[P, Command[T]]) -> Callable[Concatenate["RL", P], T]:
    def method(self: "RL", /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.run(builder(*args, **kwargs))

    method.__doc__ = builder.__doc__
    method.__name__ = builder.__name__
    return method


def _async(builder: Callable[P, Command[T]]) -> Callable[Concatenate["AsyncRL", P], Awaitable[T]]:
    async def method(self: "AsyncRL", /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.run(builder(*args, **kwargs))

    method.__doc__ = builder.__doc__
    method.__name__ = builder.__name__
    return method


class RL:
    """rl's commands on a redis-py ``Redis`` or ``RedisCluster`` client."""

    def __init__(self, client: Any) -> None:
        #: the redis-py client the commands go through
        self.client = client

    def run(self, command: Command[T]) -> T:
        """Sends ``command`` (at most once unless it is read-only) and parses its reply."""
        if command.read_only:
            return command.parse(self.client.execute_command(*command.args))
        return command.parse(send_once(self.client, command.args, command.key))

    take = _sync(commands.take)
    window = _sync(commands.window)
    quota = _sync(commands.quota)
    distinct = _sync(commands.distinct)
    lease_acquire = _sync(commands.lease_acquire)
    lease_release = _sync(commands.lease_release)
    lease_renew = _sync(commands.lease_renew)
    lease_list = _sync(commands.lease_list)
    box_status = _sync(commands.box_status)
    box_trip = _sync(commands.box_trip)
    box_release = _sync(commands.box_release)
    throttle = _sync(commands.throttle)


class AsyncRL:
    """rl's commands on a ``redis.asyncio`` ``Redis`` or ``RedisCluster`` client."""

    def __init__(self, client: Any) -> None:
        #: the redis.asyncio client the commands go through
        self.client = client

    async def run(self, command: Command[T]) -> T:
        """Sends ``command`` (at most once unless it is read-only) and parses its reply."""
        if command.read_only:
            return command.parse(await self.client.execute_command(*command.args))
        return command.parse(await send_once_async(self.client, command.args, command.key))

    take = _async(commands.take)
    window = _async(commands.window)
    quota = _async(commands.quota)
    distinct = _async(commands.distinct)
    lease_acquire = _async(commands.lease_acquire)
    lease_release = _async(commands.lease_release)
    lease_renew = _async(commands.lease_renew)
    lease_list = _async(commands.lease_list)
    box_status = _async(commands.box_status)
    box_trip = _async(commands.box_trip)
    box_release = _async(commands.box_release)
    throttle = _async(commands.throttle)
