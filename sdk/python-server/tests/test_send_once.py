"""A decision is charged once even when its reply comes late: redis-py's
clients (whose default Retry sends a command again after a timeout) time
out while the server is in DEBUG SLEEP; rl's typed commands raise the
timeout and Redis runs the command once (INFO commandstats), sync, asyncio
and in a cluster. Read-only commands keep the client's retries."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterator, List

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import RedisCluster

from rl_server import RL, AsyncRL, Bucket, Window
from servers import RedisServer

SLEEP = "0.6"
#: redis-py's default Retry sends a timed-out command again 10 times
TIMEOUT = 0.2


def calls(node: redis.Redis, command: str) -> int:
    """How many times ``command`` ran on ``node`` since CONFIG RESETSTAT."""
    stats: dict[str, Any] = node.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


class Sleeper:
    """DEBUG SLEEP on ``port`` from another thread, for ``with``."""

    def __init__(self, port: int) -> None:
        self.conn = redis.Redis(port=port)
        self.conn.ping()
        self.thread = threading.Thread(target=self.conn.execute_command, args=("DEBUG", "SLEEP", SLEEP))

    def __enter__(self) -> None:
        self.thread.start()
        time.sleep(0.2)  # the server is asleep before the call under test

    def __exit__(self, *exc: object) -> None:
        self.thread.join(10)
        self.conn.close()


@pytest.fixture
def fresh(server: RedisServer) -> Iterator[redis.Redis]:
    """An emptied server's connection, its command statistics reset."""
    c = redis.Redis(port=server.port)
    c.flushall()
    c.config_resetstat()
    yield c
    c.close()


def test_late_reply_charges_once_sync(server: RedisServer, fresh: redis.Redis) -> None:
    c = redis.Redis(port=server.port, socket_timeout=TIMEOUT)
    assert c.get_retry() is not None and c.get_retry().get_retries() > 0  # the default that re-sends
    c.ping()
    with Sleeper(server.port), pytest.raises(redis.TimeoutError):
        RL(c).take(Bucket("once:sync", 100, 100, 1000))
    assert calls(fresh, "rl.take") == 1
    assert RL(fresh).take(Bucket("once:sync", 100, 100, 1000), cost=0).remaining == 99
    # the client works on: the connection that timed out was closed, not reused
    assert RL(c).window(Window("once:w", 5, 60)).remaining == 4
    assert c.ping()
    c.close()


def test_late_reply_charges_once_asyncio(server: RedisServer, fresh: redis.Redis) -> None:
    async def main() -> None:
        c = aioredis.Redis(port=server.port, socket_timeout=TIMEOUT)
        sleeper = aioredis.Redis(port=server.port)
        await c.ping()
        await sleeper.ping()
        sleep = asyncio.ensure_future(sleeper.execute_command("DEBUG", "SLEEP", SLEEP))
        await asyncio.sleep(0.2)  # the server is asleep before the call under test
        with pytest.raises(redis.TimeoutError):
            await AsyncRL(c).lease_acquire("once:lease", 10, 60)
        await sleep
        assert (await AsyncRL(c).take(Bucket("once:a", 5, 5, 60))).remaining == 4
        await c.aclose()
        await sleeper.aclose()

    asyncio.run(main())
    assert calls(fresh, "rl.lease|acquire") == 1
    assert len(RL(fresh).lease_list("once:lease")) == 1


def test_read_only_commands_keep_retries(server: RedisServer, fresh: redis.Redis) -> None:
    c = redis.Redis(port=server.port, socket_timeout=TIMEOUT)
    c.ping()
    with Sleeper(server.port):
        # timed out, sent again on a new connection, answered after the sleep
        assert not RL(c).box_status("once:box").active
    c.close()


@pytest.fixture
def cluster_client(cluster: List[RedisServer]) -> Iterator[RedisCluster]:
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=TIMEOUT)
    yield rc
    rc.close()


def test_late_reply_charges_once_cluster(cluster: List[RedisServer], cluster_client: RedisCluster) -> None:
    key = "rl:{once}:cluster"
    port = cluster_client.get_node_from_key(key).port
    owner = redis.Redis(port=port)
    owner.delete(key)
    owner.config_resetstat()
    rl = RL(cluster_client)
    assert rl.box_status(key).level == 0  # the client knows the slots
    with Sleeper(port), pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        rl.take(Bucket(key, 100, 100, 1000))
    assert calls(owner, "rl.take") == 1
    assert RL(owner).take(Bucket(key, 100, 100, 1000), cost=0).remaining == 99
    assert rl.take(Bucket(key, 100, 100, 1000)).remaining == 98  # the client works on
    owner.close()

    async def main() -> None:
        arc = aioredis.RedisCluster(host="127.0.0.1", port=port, socket_timeout=TIMEOUT)
        arl = AsyncRL(arc)
        await arl.box_status(key)
        sleeper = aioredis.Redis(port=port)
        await sleeper.ping()
        sleep = asyncio.ensure_future(sleeper.execute_command("DEBUG", "SLEEP", SLEEP))
        await asyncio.sleep(0.2)  # the server is asleep before the call under test
        with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
            await arl.take(Bucket(key, 100, 100, 1000))
        await sleep
        await sleeper.aclose()
        await arc.aclose()

    owner = redis.Redis(port=port)
    owner.config_resetstat()
    asyncio.run(main())
    assert calls(owner, "rl.take") == 1
    assert RL(owner).take(Bucket(key, 100, 100, 1000), cost=0).remaining == 97
    owner.close()


def owner_seen_by(conn: redis.Redis, key: str) -> int:
    """The port of the node that ``conn``'s node says owns ``key``."""
    try:
        conn.exists(key)
        return int(conn.connection_pool.connection_kwargs["port"])
    except redis.exceptions.MovedError as moved:
        return int(moved.port)


def move_slot(cluster: List[RedisServer], key: str, from_port: int, to_port: int) -> None:
    """Moves the (empty) slot of ``key`` from one node to another as a
    resharding does: importing, migrating, then the new owner everywhere."""
    conns = {n.port: redis.Redis(port=n.port) for n in cluster}
    slot = int(conns[to_port].cluster("keyslot", key))
    assert conns[from_port].cluster("countkeysinslot", slot) == 0
    ids = {port: c.cluster("myid") for port, c in conns.items()}
    conns[to_port].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from_port])
    conns[from_port].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
    for port in [to_port, from_port] + [p for p in conns if p not in (to_port, from_port)]:
        conns[port].execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[to_port])
    deadline = time.monotonic() + 10
    owners = {owner_seen_by(c, key) for c in conns.values()}
    while owners != {to_port} and time.monotonic() < deadline:
        time.sleep(0.05)
        owners = {owner_seen_by(c, key) for c in conns.values()}
    assert owners == {to_port}, owners
    for c in conns.values():
        c.close()


def test_moved_is_followed_and_charges_once(cluster: List[RedisServer], cluster_client: RedisCluster) -> None:
    """A slot moved after the client read the slots: the typed command
    follows MOVED and runs once, on the new owner, sync and asyncio."""
    key = "rl:{once-moved}:b"
    bucket = Bucket(key, 100, 100, 1000)
    rl = RL(cluster_client)
    assert rl.box_status(key).level == 0  # the client knows the slots
    old = cluster_client.get_node_from_key(key).port
    new = next(n.port for n in cluster if n.port != old)
    owner = redis.Redis(port=new)
    owner.config_resetstat()
    move_slot(cluster, key, old, new)
    assert rl.take(bucket).remaining == 99
    assert calls(owner, "rl.take") == 1
    assert cluster_client.get_node_from_key(key).port == new  # the client learnt the move

    async def main() -> None:
        arc = aioredis.RedisCluster(host="127.0.0.1", port=old, socket_timeout=TIMEOUT)
        arl = AsyncRL(arc)
        await arl.box_status(key)
        move_slot(cluster, key, new, old)
        assert (await arl.take(bucket)).remaining == 99
        await arc.aclose()

    previous = redis.Redis(port=old)
    previous.config_resetstat()
    owner.delete(key)  # a slot moves back empty here: the count starts again
    asyncio.run(main())
    assert calls(previous, "rl.take") == 1
    previous.close()
    owner.close()


def test_limits_storage_hit_counts_once(server: RedisServer, fresh: redis.Redis) -> None:
    from rl_server.limits_storage import RLStorage

    storage = RLStorage(f"rl://127.0.0.1:{server.port}", socket_timeout=TIMEOUT)
    storage.client.ping()
    with Sleeper(server.port), pytest.raises(redis.TimeoutError):
        storage.incr("once/1/minute", 60)
    assert calls(fresh, "rl.window") == 1
    assert storage.get("once/1/minute") == 1
