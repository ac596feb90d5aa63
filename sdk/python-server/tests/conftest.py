"""Fixtures: a redis-server and a Valkey with the rl module (each test that
takes ``server`` runs on both), a three-node cluster, and the counts line
of sdk/test.sh (sdk/e2e/pytest_counts.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any, Iterator, List

import pytest
import redis

from servers import ROOT, RedisServer

sys.path.insert(0, str(ROOT / "sdk/e2e"))
from pytest_counts import write_counts  # noqa: E402


@pytest.fixture(scope="session", params=["redis", "valkey"])
def server(request: Any) -> Iterator[RedisServer]:
    # DEBUG SLEEP: the tests of replies that come late
    s = RedisServer(request.param, ["--enable-debug-command", "yes"])
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
    nodes = [RedisServer("redis", ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                    "--enable-debug-command", "yes"])
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
    write_counts(terminalreporter, "sdk-python-server")
