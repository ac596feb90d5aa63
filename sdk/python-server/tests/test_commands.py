"""Typed commands against a real server with the module: every command's
reply as a decision, sync and asyncio, and a three-node cluster."""

from __future__ import annotations

import asyncio
from typing import List

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import RedisCluster

from rl_server import RL, AsyncRL, Bucket, Penalty, Quota, Status, Window
from rl_server import commands, decisions
from servers import RedisServer


def test_take_allowed_then_throttled_with_binding(client: redis.Redis) -> None:
    rl = RL(client)
    key, tenant = Bucket("rl:{t:1}:k", 3, 3, 60), Bucket("rl:{t:1}:tenant", 5, 5, 60)
    d = rl.take(key, tenant, cost=2)
    assert (d.status, d.limit, d.remaining, d.binding, d.strikes_remaining, d.granted) == \
        (Status.ALLOWED, 3, 1, 0, None, None)
    assert d.allowed and d.retry_after_ms == 0 and 0 < d.reset_ms <= 40000
    d = rl.take(key, tenant, cost=2)
    assert d.status is Status.THROTTLED and not d.allowed
    assert d.remaining == 1 and 0 < d.retry_after_ms <= 20000 and d.binding == 0
    # the tenant binds for another key
    d = rl.take(Bucket("rl:{t:1}:k2", 10, 10, 60), tenant, cost=4)
    assert d.status is Status.THROTTLED and d.binding == 1 and d.limit == 5


def test_take_penalty_box_partial_and_refund(client: redis.Redis) -> None:
    rl = RL(client)
    b = Bucket("login", 1, 1, 60)
    pen = Penalty(1, 60, box=(5, 10, 0))
    assert rl.take(b, penalty=pen).strikes_remaining == 1
    first = rl.take(b, penalty=pen)  # first refusal: no strike
    assert first.status is Status.THROTTLED and first.strikes_remaining == 1
    boxed = rl.take(b, penalty=pen)  # early retry: strike 1 trips the box
    assert (boxed.status, boxed.box_level, boxed.strikes_remaining) == (Status.BOXED, 1, 0)
    assert boxed.retry_after_ms == boxed.reset_ms and 0 < boxed.retry_after_ms <= 5000
    assert rl.box_status("login").active and rl.box_release("login", forget=True)
    assert not rl.box_status("login").active
    # EVERY: the first refusal is a strike too (a lockout)
    lockout = Penalty(1, 60, box=(5, 10, 0), every=True)
    assert rl.take(Bucket("lock", 1, 1, 60), penalty=lockout).status is Status.ALLOWED
    assert rl.take(Bucket("lock", 1, 1, 60), penalty=lockout).status is Status.BOXED
    assert rl.window(Window("lockw", 1, 60), penalty=lockout).status is Status.ALLOWED
    assert rl.window(Window("lockw", 1, 60), penalty=lockout).status is Status.BOXED
    with pytest.raises(ValueError, match="EVERY"):
        Penalty(1, 60, every="yes").args()  # type: ignore[arg-type]
    p = rl.take(Bucket("p", 10, 1, 60), cost=25, partial=3)
    assert p.status is Status.ALLOWED and p.granted == 10
    r = rl.take(Bucket("p", 10, 1, 60), refund=4)
    assert r.remaining == 4


def test_take_delay(client: redis.Redis) -> None:
    rl = RL(client)
    assert rl.take(Bucket("psp", 1, 10, 1), delay=5).status is Status.ALLOWED
    d = rl.take(Bucket("psp", 1, 10, 1), delay=5)
    assert d.status is Status.DELAYED and d.allowed and 0 < d.retry_after_ms <= 100


def test_window_modes_and_also(client: redis.Redis) -> None:
    rl = RL(client)
    m, h = Window("vel:{u}:1m", 2, 60), Window("vel:{u}:1h", 3, 3600)
    assert rl.window(m, h, mode="EXACT").remaining == 1
    assert rl.window(m, h, mode="EXACT").remaining == 0
    d = rl.window(m, h, mode="EXACT")
    assert d.status is Status.THROTTLED and d.binding == 0 and 59000 < d.retry_after_ms <= 60000
    probe = rl.window(Window("f", 5, 10), cost=0, mode="FIXED")
    assert probe.status is Status.ALLOWED and probe.remaining == 5 and client.exists("f") == 0
    assert rl.window(Window("s", 5, 10), cost=5).remaining == 0


def test_quota_peek_and_distinct(client: redis.Redis) -> None:
    rl = RL(client)
    q = Quota("rl:{t}:month", 10, "month")
    assert rl.quota(q, cost=4, peek=True).remaining == 6 and client.exists("rl:{t}:month") == 0
    assert rl.quota(q, cost=10).status is Status.ALLOWED
    d = rl.quota(q)
    assert d.status is Status.THROTTLED and d.retry_after_ms == d.reset_ms > 0
    assert rl.distinct("ip", "alice", 2, 60).remaining == 1
    assert rl.distinct("ip", "bob", 2, 60).remaining == 0
    assert rl.distinct("ip", "carol", 2, 60, peek=True).status is Status.THROTTLED
    boxed = rl.distinct("ip", "carol", 2, 60, trip=(3, 0))
    assert boxed.status is Status.BOXED and boxed.manual_box and boxed.box_level == 3


def test_lease_lifecycle(client: redis.Redis) -> None:
    rl = RL(client)
    a = rl.lease_acquire("ledger:9", 1, 30)
    assert a.granted and a.lease_id and len(a.lease_id) == 32 and (a.in_use, a.max) == (1, 1)
    b = rl.lease_acquire("ledger:9", 1, 30)
    assert not b.granted and b.lease_id is None and 0 < b.retry_after_ms <= 30000
    assert [i for i, _ in rl.lease_list("ledger:9")] == [a.lease_id]
    assert rl.lease_renew("ledger:9", a.lease_id, 10)
    assert rl.lease_release("ledger:9", a.lease_id) and not rl.lease_release("ledger:9", a.lease_id)
    assert rl.lease_acquire("ledger:9", 1, 30, lease_id="req-1").lease_id == "req-1"


def test_box_trip_and_throttle(client: redis.Redis) -> None:
    rl = RL(client)
    s = rl.box_trip("ip:9", 2, 900)
    assert (s.level, s.offenses) == (2, 1) and 899000 < s.ttl_ms <= 900000
    assert rl.take(Bucket("ip:9", 10, 10, 60)).status is Status.BOXED
    t = rl.throttle("cell", 1, 1, 60)
    assert (t.limited, t.limit, t.remaining, t.retry_after_s) == (False, 2, 1, None)
    rl.throttle("cell", 1, 1, 60)
    t = rl.throttle("cell", 1, 1, 60)
    assert t.limited and t.retry_after_s is not None and 0 < t.retry_after_s <= 60


@pytest.mark.parametrize("bad, name", [
    (lambda: commands.take(Bucket("k", 0, 1, 1)), "capacity"),
    (lambda: commands.take(Bucket("k", 1, 1, 0.0001)), "period"),
    (lambda: commands.window(Window("k", 1, 1), Window("j", 1, -1)), "ALSO window"),
    (lambda: commands.quota(Quota("k", 1, "YEAR")), "period"),
    (lambda: commands.take(Bucket("k", 1, 1, 1), jitter=101), "JITTER"),
    (lambda: commands.lease_acquire("k", 1001, 1), "max"),
])
def test_bad_arguments_named_before_sending(bad: object, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        bad()  # type: ignore[operator]


def test_server_errors_come_through(client: redis.Redis) -> None:
    client.set("str", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        RL(client).take(Bucket("str", 1, 1, 1))


def test_asyncio_client(server: RedisServer) -> None:
    async def main() -> List[Status]:
        c = aioredis.Redis(port=server.port)
        await c.delete("a:1")
        rl = AsyncRL(c)
        out = [(await rl.take(Bucket("a:1", 20, 1, 60))).status for _ in range(3)]
        out += [d.status for d in await asyncio.gather(
            *(rl.take(Bucket("a:1", 20, 1, 60)) for _ in range(30)))]
        lease = await rl.lease_acquire("a:lease", 2, 5)
        assert lease.granted and lease.lease_id is not None
        assert await rl.lease_release("a:lease", lease.lease_id)
        await c.aclose()
        return out

    statuses = asyncio.run(main())
    assert statuses.count(Status.ALLOWED) == 20 and statuses.count(Status.THROTTLED) == 13


def test_cluster_routes_by_key(cluster: List[RedisServer]) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    rl = RL(rc)
    keys = [f"rl:{{t:{i}}}:k" for i in range(12)]  # spread over the three nodes
    for k in keys:
        assert rl.take(Bucket(k, 2, 1, 60), Bucket(k + ":tenant", 5, 1, 60)).remaining == 1
        assert rl.lease_acquire(k + ":lease", 1, 5).granted
        assert rl.box_trip(k + ":box", 1, 5).level == 1
    owners = {rc.get_node_from_key(k).port for k in keys}
    assert len(owners) == 3
    for n in cluster:  # each key lives on its own node
        local = redis.Redis(port=n.port)
        mine = [k for k in keys if rc.get_node_from_key(k).port == n.port]
        assert all(local.type(k) == b"rl-record" for k in mine)
    rc.close()

    async def main() -> None:
        arc = aioredis.RedisCluster(host="127.0.0.1", port=cluster[0].port)
        arl = AsyncRL(arc)
        for k in keys:
            assert (await arl.take(Bucket(k, 2, 1, 60))).remaining == 0
        await arc.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("raw, message", [
    ([1, 2, 3], "expected 8 or 9 integers"),
    ([1, 5, 4, 0, 0, 0, -1, True], "expected integers"),
    ([1, 5, 4, 0, 0, 0, -1, b"0"], "expected integers"),
    ([7, 5, 4, 0, 0, 0, -1, 0], "unknown status 7"),
    (b"OK", "expected 8 or 9 integers"),
])
def test_replies_of_another_shape_are_refused(raw: object, message: str) -> None:
    # the Decision and the limits storage's counter read check a reply alike
    for read in (decisions.decision, decisions.remaining, decisions.admitted):
        with pytest.raises(decisions.ReplyError, match=message):
            read(raw)
    assert decisions.remaining([1, 5, 4, 0, 0, 0, -1, 0]) == 4
    assert decisions.remaining((0, 5, 0, 9, 9, 0, 2, 1, 0)) == 0
    assert decisions.decision([1, 5, 4, 0, 0, 0, -1, 0]).remaining == 4
    for status, admitted in ((1, True), (2, True), (0, False), (-1, False)):
        assert decisions.admitted([status, 5, 4, 0, 0, 0, -1, 0]) is admitted
