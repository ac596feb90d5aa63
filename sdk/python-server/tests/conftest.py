"""Fixtures: a redis-server and a Valkey with the rl module (each test that
takes ``server`` runs on both), and the counts line of sdk/test.sh."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Iterator, List

import pytest
import redis

from servers import RedisServer


@pytest.fixture(scope="session", params=["redis", "valkey"])
def server(request: Any) -> Iterator[RedisServer]:
    s = RedisServer(request.param)
    yield s
    s.close()


@pytest.fixture
def flushed(server: RedisServer) -> Iterator[RedisServer]:
    """``server``, emptied."""
    redis.Redis(port=server.port).flushall()
    yield server


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=server.port)
    c.flushall()
    yield c
    c.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[List[RedisServer]]:
    nodes = [RedisServer("redis", ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
             for _ in range(3)]
    try:
        subprocess.run(["redis-cli", "--cluster", "create",
                        *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [redis.Redis(port=n.port).cluster("info") for n in nodes]
            if all(i["cluster_state"] == "ok" for i in infos):
                break
            time.sleep(0.2)
        yield nodes
    finally:
        for n in nodes:
            n.close()


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
