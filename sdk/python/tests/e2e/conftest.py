"""Fixtures of the end-to-end tests: one redis-server with the rl module and
one nginx running the gateway for the whole session (``sdk/e2e/launcher.py``);
each scenario uses its own API key, so scenarios share no bucket."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "e2e"))

import launcher  # noqa: E402


@pytest.fixture(scope="session")
def gateway() -> Iterator[launcher.Gateway]:
    gw = launcher.Gateway.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(autouse=True)
def no_lua_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every e2e test also fails on a Lua error in nginx's error.log."""
    yield
    if "gateway" in request.fixturenames:
        gw = request.getfixturevalue("gateway")
        assert gw.lua_errors() == []
