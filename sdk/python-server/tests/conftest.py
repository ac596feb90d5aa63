"""Fixtures: a redis-server and a Valkey with the rl module (each test that
takes ``server`` runs on both), and the counts line of sdk/test.sh."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest
import redis

from servers import RedisServer


@pytest.fixture(scope="session", params=["redis", "valkey"])
def server(request: Any) -> Iterator[RedisServer]:
    s = RedisServer(request.param)
    yield s
    s.close()


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=server.port)
    c.flushall()
    yield c
    c.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = os.environ.get("RL_SDK_COUNTS")
    if not path:
        return
    stats = terminalreporter.stats

    def n(*keys: str) -> int:
        return sum(len(stats.get(k, [])) for k in keys)

    with open(path, "a") as f:
        f.write(f"test result: sdk-python-server. {n('passed')} passed; "
                f"{n('failed', 'error', 'xpassed')} failed; {n('skipped', 'xfailed')} ignored;\n")
