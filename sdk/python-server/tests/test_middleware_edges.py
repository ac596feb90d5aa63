"""The middleware's edge cases under uvicorn over real HTTP: routes matched
on the path Starlette routes on (under a root path, in a mounted sub-app)."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
import redis

from servers import HERE, App, RedisServer

EDGES = str(HERE / "apps" / "edges.py")


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
