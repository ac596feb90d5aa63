"""Sending a command at most once through a redis-py client.

rl's commands charge: each ``RL.TAKE`` that runs spends its cost. redis-py
sends a command again when its reply is late or its connection drops (the
``Retry`` of the client: 10 times on ``ConnectionError`` and
``TimeoutError`` by default), and a command that had already run is then
charged twice. The functions here send a command once and raise any
timeout or connection error after it was sent, leaving the client's own
configuration (and so its other commands) untouched:

- ``redis.Redis``: a connection from the client's pool, ``send_command``
  and the client's ``parse_response``; connecting (before anything is
  sent) keeps the connection's retries.
- ``redis.RedisCluster``: ``execute_command`` with ``target_nodes`` the
  node of the command's key, which redis-py runs without its retries on
  connection errors while still following MOVED, ASK and TRYAGAIN
  (replies that say the command did not run there)."""

from __future__ import annotations

from typing import Any, Sequence

import redis
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from .commands import Arg


def send_once(client: Any, args: Sequence[Arg], key: Arg) -> Any:
    """``args`` sent at most once through ``client`` (``redis.Redis`` or
    ``redis.RedisCluster``); its reply, or the error that ended the call."""
    if isinstance(client, redis.RedisCluster):
        cluster: Any = client  # redis-py's annotations of these are partial
        return cluster.execute_command(*args, target_nodes=cluster.get_node_from_key(key))
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command(*args)
        return client.parse_response(conn, args[0])
    except ResponseError:
        raise
    except BaseException:
        # the reply may still come: this connection must not serve another call
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


async def send_once_async(client: Any, args: Sequence[Arg], key: Arg) -> Any:
    """``send_once`` for ``redis.asyncio``'s ``Redis`` and ``RedisCluster``."""
    if isinstance(client, aioredis.RedisCluster):
        cluster: Any = client
        await cluster.initialize()
        return await cluster.execute_command(*args, target_nodes=cluster.get_node_from_key(key))
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        await conn.send_command(*args)
        return await client.parse_response(conn, args[0])
    except ResponseError:
        raise
    except BaseException:
        await conn.disconnect(nowait=True)
        raise
    finally:
        await pool.release(conn)
