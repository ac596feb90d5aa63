"""The middleware's edge cases under uvicorn over real HTTP: routes matched
on the path Starlette routes on (under a root path, in a mounted sub-app);
HEAD, which Starlette serves from a GET route, limited as that GET; the
local limiter charging a cost function's points; which X-Request-Id a
problem body echoes; shadow mode still requiring an Idempotency-Key."""

from __future__ import annotations

import re
from typing import Iterator

import httpx
import pytest
import redis

from rl_server import responses
from rl_server.routes import Rate, Route, compile_routes, match
from servers import HERE, App, RedisServer, free_port
from test_middleware import slow_request, until

EDGES = str(HERE / "apps" / "edges.py")


@pytest.fixture
def plain(flushed: RedisServer) -> Iterator[App]:
    """The edges app under no root path."""
    app = App([EDGES], {"REDIS_URL": flushed.url})
    yield app
    app.close()


@pytest.fixture(params=["", "/api"])
def edges(request: pytest.FixtureRequest, flushed: RedisServer) -> Iterator[App]:
    """The edges app, under no root path and under /api."""
    app = App([EDGES], {"REDIS_URL": flushed.url, "RL_ROOT_PATH": request.param})
    yield app
    app.close()


@pytest.mark.parametrize("path, name, key", [("/hello", "hello", "rl:hello:127.0.0.1"),
                                            ("/v1/hello", "v1-hello", "rl:v1:127.0.0.1")])
def test_routes_match_under_a_root_path_and_a_mount(edges: App, flushed: RedisServer, path: str,
                                                     name: str, key: str) -> None:
    rs = [httpx.get(edges.url + path, timeout=10) for _ in range(4)]
    assert [r.status_code for r in rs] == [200, 200, 200, 429]
    assert rs[0].headers["RateLimit"] == f'"{name}";r=2;t=20'
    assert redis.Redis(port=flushed.port).exists(key) == 1


def test_head_charged_like_get(plain: App) -> None:
    assert [httpx.head(f"{plain.url}/hello", timeout=10).status_code for _ in range(3)] == [200] * 3
    r = httpx.get(f"{plain.url}/hello", timeout=10)
    assert r.status_code == 429 and r.json()["policy"] == "hello"
    assert httpx.head(f"{plain.url}/hello", timeout=10).status_code == 429


def test_head_holds_a_lease(plain: App, flushed: RedisServer) -> None:
    r0 = redis.Redis(port=flushed.port)
    s = slow_request(plain, "/work?seconds=60", method="HEAD")
    try:
        until(lambda: len(r0.execute_command("RL.LEASE", "LIST", "rl:work")) == 1, "HEAD holds the lease")
        assert httpx.get(f"{plain.url}/work", timeout=10).status_code == 429
        assert httpx.head(f"{plain.url}/work", timeout=10).status_code == 429
    finally:
        s.close()
    until(lambda: r0.execute_command("RL.LEASE", "LIST", "rl:work") == [], "released when the client left")
    assert httpx.head(f"{plain.url}/work", timeout=10).status_code == 200


def test_head_matches_a_get_unless_a_head_route_is_declared() -> None:
    r = Route(rates=[Rate("r", "k", 1, 1, 1)])
    both = compile_routes({"GET /x/{id}": r, "HEAD /x/{id}": r, "POST /y": r})
    found = match(both, "HEAD", "/x/7")
    assert found is not None and found[0].name == "HEAD /x/{id}" and found[1] == {"id": "7"}
    found = match(compile_routes({"GET /x/{id}": r}), "HEAD", "/x/7")
    assert found is not None and found[0].name == "GET /x/{id}"
    assert match(both, "HEAD", "/y") is None


def test_local_fallback_charges_the_cost_function() -> None:
    # nothing listens on the port: every Redis call fails at once
    app = App([EDGES], {"REDIS_URL": f"redis://127.0.0.1:{free_port()}"})
    try:
        rs = [httpx.post(f"{app.url}/bulk?points=6", timeout=10) for _ in range(2)]
        assert [r.status_code for r in rs] == [200, 429]
        assert all(r.headers[responses.DEGRADED] == "fallback" for r in rs)
        assert rs[1].json()["policy"] == "bulk-degraded"
        assert rs[1].headers["RateLimit"] == '"bulk-degraded";r=4;t=36'
        assert httpx.post(f"{app.url}/bulk?points=4", timeout=10).status_code == 200
    finally:
        app.close()


@pytest.mark.parametrize("given, echoed", [
    (b"req-1.2:3_x", True), (b"a" * 64, True), (b"a" * 65, False), (b"", False),
    (b"<script>alert(1)</script>", False), (b"id with spaces", False),
    ("\u00e9t\u00e9".encode("latin-1"), False),
])
def test_request_id_echoed_only_when_safe(plain: App, given: bytes, echoed: bool) -> None:
    r = httpx.post(f"{plain.url}/pay", headers=[(b"X-Request-Id", given)], timeout=10)
    assert r.status_code == 400 and r.json()["type"].endswith("/idempotency-key-required")
    rid = r.json()["request_id"]
    if echoed:
        assert rid == given.decode()
    else:
        assert re.fullmatch("[0-9a-f]{32}", rid), rid


def test_shadow_mode_still_requires_an_idempotency_key(plain: App, flushed: RedisServer) -> None:
    r = httpx.post(f"{plain.url}/shadow-pay", timeout=10)
    assert r.status_code == 400 and r.json()["type"].endswith("/idempotency-key-required")
    assert "RateLimit" not in r.headers
    # with one, the bucket of 1 is spent and shadow mode lets the second through unmarked
    rs = [httpx.post(f"{plain.url}/shadow-pay", headers={"Idempotency-Key": f"op-{i}"}, timeout=10)
          for i in range(2)]
    assert [x.status_code for x in rs] == [200, 200] and all("RateLimit" not in x.headers for x in rs)
    assert redis.Redis(port=flushed.port).exists("rl:shadow-pay:127.0.0.1") == 1
