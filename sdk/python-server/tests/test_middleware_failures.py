"""The middleware when Redis is killed and comes back, or is slow, under
each failure setting (503 fail closed; the local limiter, marked degraded);
what a call answered after its deadline, or a request failed midway, took
is given back; bad configuration refused at start with the option named."""

from __future__ import annotations

import subprocess
import sys
from typing import Iterator

import httpx
import pytest
import redis

from rl_server import responses
from rl_server.asgi import RateLimitMiddleware
from rl_server.routes import Rate, Route, Window
from servers import HERE, App, RedisServer
from test_middleware import EXAMPLES, pay, until

BASE = "https://api.example.com/problems"


@pytest.fixture(params=["redis", "valkey"])
def own_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    s = RedisServer(request.param)
    yield s
    s.close()


@pytest.fixture
def app(own_server: RedisServer) -> Iterator[App]:
    a = App([str(EXAMPLES / "asgi_fastapi.py")], {"REDIS_URL": own_server.url, "RL_TIMEOUT": "0.5"})
    yield a
    a.close()


def balance(app: App) -> httpx.Response:
    return httpx.get(f"{app.url}/balance", headers={"X-Api-Key": "b"}, timeout=10)


def test_redis_killed_and_back(app: App, own_server: RedisServer) -> None:
    assert pay(app).status_code == 200 and balance(app).status_code == 200
    own_server.stop()
    # fails closed: 503, Retry-After, the gateway's body
    r = pay(app)
    assert r.status_code == 503 and r.headers["Retry-After"] == "15"
    assert r.json() == {
        "type": f"{BASE}/rate-limiter-unavailable", "title": "Rate limiter unavailable", "status": 503,
        "detail": responses.fail_closed_detail(15), "instance": "/payments",
        "request_id": r.json()["request_id"], "recommended_backoff": "none", "quota_tier": "growth"}
    # local: the in-process bucket at half the capacity (5 -> 2), marked degraded
    rs = [balance(app) for _ in range(3)]
    assert [x.status_code for x in rs] == [200, 200, 429]
    assert all(x.headers[responses.DEGRADED] == "fallback" for x in rs)
    body = rs[2].json()
    assert body["degraded"] == "fallback" and body["policy"] == "balance-degraded"
    assert int(rs[2].headers["Retry-After"]) >= 1
    own_server.start()  # back, empty: decisions come from Redis again
    until(lambda: pay(app).status_code == 200, "payments served from Redis again")
    r = balance(app)
    assert r.status_code == 200 and responses.DEGRADED not in r.headers
    assert r.headers["RateLimit"] == '"balance";r=4;t=12'


def test_redis_slow(app: App, own_server: RedisServer) -> None:
    r0 = redis.Redis(port=own_server.port)
    assert pay(app).status_code == 200
    r0.execute_command("CLIENT", "PAUSE", "3000", "WRITE")  # every rl call waits 3 s > 0.5 s
    try:
        assert pay(app).status_code == 503
        r = balance(app)
        assert r.status_code == 200 and r.headers[responses.DEGRADED] == "fallback"
    finally:
        r0.execute_command("CLIENT", "UNPAUSE")
    until(lambda: pay(app).status_code == 200, "fast again")


@pytest.fixture
def late_app(own_server: RedisServer) -> Iterator[App]:
    a = App([str(HERE / "apps" / "late_reply.py")], {"REDIS_URL": own_server.url})
    yield a
    a.close()


def window_calls(r0: redis.Redis) -> int:
    """RL.WINDOW commands the server has run."""
    return int(r0.info("commandstats").get("cmdstat_rl.window", {}).get("calls", 0))


def window_left(r0: redis.Redis, key: str) -> int:
    """What is left in one of late_reply.py's windows (COST 0 spends nothing)."""
    return int(r0.execute_command("RL.WINDOW", key, 10, 600, "EXACT", "COST", 0)[2])


def test_late_reply_given_back(late_app: App, own_server: RedisServer) -> None:
    r0 = redis.Redis(port=own_server.port)
    for path in ("/closed", "/local"):
        assert [httpx.get(late_app.url + path).status_code for _ in range(3)] == [200] * 3
    calls = window_calls(r0)
    # the next charges wait in Redis past the app's 0.3 s budget, and run then
    r0.execute_command("CLIENT", "PAUSE", "5000", "WRITE")  # until UNPAUSE below
    try:
        assert httpx.get(late_app.url + "/closed", timeout=10).status_code == 503
        r = httpx.get(late_app.url + "/local", timeout=10)
        assert r.status_code == 200 and r.headers[responses.DEGRADED] == "fallback"
    finally:
        r0.execute_command("CLIENT", "UNPAUSE")
    # each late charge, once it has run, is refunded: two charges, two refunds
    until(lambda: window_calls(r0) >= calls + 4, "the late charges and their refunds", 20)
    late_app.close()  # nothing more can be sent: a second refund would be counted below
    assert window_calls(r0) == calls + 4
    assert window_left(r0, "rl:late:closed") == 7 and window_left(r0, "rl:late:local") == 7


def test_charge_given_back_when_a_later_command_fails(late_app: App, own_server: RedisServer) -> None:
    r0 = redis.Redis(port=own_server.port)
    assert httpx.get(late_app.url + "/two").status_code == 200
    r0.set("rl:late:two-quota", "not a quota")  # RL.QUOTA now answers WRONGTYPE
    calls = window_calls(r0)
    assert httpx.get(late_app.url + "/two").status_code == 503
    until(lambda: window_calls(r0) >= calls + 2, "the window's charge and its refund")
    late_app.close()
    assert window_calls(r0) == calls + 2 and window_left(r0, "rl:late:two") == 9


def test_lease_route_fails_closed_then_recovers(own_server: RedisServer) -> None:
    a = App([str(EXAMPLES / "asgi_starlette.py")], {"REDIS_URL": own_server.url})
    try:
        own_server.stop()
        r = httpx.get(f"{a.url}/work")
        assert r.status_code == 503 and r.json()["type"] == f"{BASE}/rate-limiter-unavailable"
        own_server.start()
        until(lambda: httpx.get(f"{a.url}/work").status_code == 200, "leases from Redis again")
    finally:
        a.close()


@pytest.mark.parametrize("option", ["capacity", "on_redis_failure", "timeout", "max"])
def test_bad_configuration_refused_at_start(own_server: RedisServer, option: str) -> None:
    p = subprocess.run([sys.executable, "-m", "uvicorn", "apps.bad_route:app", "--port", "0"],
                       cwd=str(HERE), env={"REDIS_URL": own_server.url, "RL_BAD": option,
                                           "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "ValueError" in p.stderr and option in p.stderr, p.stderr[-1500:]


@pytest.mark.parametrize("kwargs, named", [
    ({"routes": {"GET /x": Route(windows=[Window("w", "k", 5, 60, "BOGUS")])}}, "mode"),
    ({"routes": {"x": Route(rates=[Rate("r", "k", 1, 1, 1)])}}, "must start with '/'"),
    ({"routes": {"GET /x": Route()}}, "declares nothing"),
    ({"routes": {"GET /x": Route(rates=[Rate("r", "k", 1, 1, 1)], cost=-1)}}, "cost"),
    ({"routes": {}, "fallback_ratio": 2}, None),
    ({"routes": {}, "fail_closed_retry_after": 0}, "fail_closed_retry_after"),
    ({"routes": {}, "manual_box_status": 500}, "manual_box_status"),
])
def test_bad_options_named(kwargs: dict, named: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=named):
        RateLimitMiddleware(lambda *a: None, redis="redis://127.0.0.1:1", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="redis"):
        RateLimitMiddleware(lambda *a: None, redis="http://x", routes={})  # type: ignore[arg-type]
