"""Real sockets: hostile HTTP servers on 127.0.0.1 (ephemeral ports), as an
attacker would run them. A redirect to another origin must not carry the
API key nor lock it; the deadline bounds a request to a server that stalls.
Every wait here is bounded (a stalled handler gives up after 5 s)."""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest
import requests

from rl_client import AsyncRetryingClient, LockoutError, RetryingClient, RetryingSession


class _Hostile(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, redirect_to: Optional[str] = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.redirect_to = redirect_to
        self.seen: List[Tuple[str, Optional[str]]] = []  # (path, X-Api-Key)
        self.release = threading.Event()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Hostile

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, headers: Dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        self.server.seen.append((self.path, self.headers.get("X-Api-Key")))
        if self.path == "/redirect" and self.server.redirect_to:
            return self._send(302, {"Location": self.server.redirect_to + "/steal"})
        if self.path == "/steal":
            return self._send(429, {"X-Penalty-Box-Status": "Active-Lockout",
                                    "Retry-After": "31536000"})
        if self.path == "/stall":
            self.server.release.wait(5)
        return self._send(200, {})


def _serve(server: _Hostile) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def servers() -> Iterator[Tuple[_Hostile, _Hostile]]:
    """(the real API, a foreign host it redirects /redirect to)."""
    foreign = _Hostile()
    api = _Hostile(redirect_to=foreign.base)
    threads = [_serve(foreign), _serve(api)]
    yield api, foreign
    for s in (api, foreign):
        s.release.set()
        s.shutdown()
        s.server_close()
    for t in threads:
        t.join(5)


def _check_no_key_leaked_nor_locked(api: _Hostile, foreign: _Hostile, result: Any,
                                    after: Any) -> None:
    assert isinstance(result, LockoutError)  # the foreign answer is still reported
    assert foreign.seen == [("/steal", None)]  # without the key
    assert after == 200  # and the key is not locked for the real host
    assert api.seen == [("/redirect", "key-a"), ("/ok", "key-a")]


def test_requests_drops_the_key_on_a_cross_origin_redirect(
        servers: Tuple[_Hostile, _Hostile]) -> None:
    api, foreign = servers
    with RetryingSession() as s:
        s.headers["X-Api-Key"] = "key-a"
        try:
            result: Any = s.get(api.base + "/redirect", timeout=5)
        except LockoutError as e:
            result = e
        after = s.get(api.base + "/ok", timeout=5).status_code
    _check_no_key_leaked_nor_locked(api, foreign, result, after)


def test_httpx_drops_the_key_on_a_cross_origin_redirect(
        servers: Tuple[_Hostile, _Hostile]) -> None:
    api, foreign = servers
    with RetryingClient(headers={"X-Api-Key": "key-a"}, follow_redirects=True,
                        timeout=5) as c:
        try:
            result: Any = c.get(api.base + "/redirect")
        except LockoutError as e:
            result = e
        after = c.get(api.base + "/ok").status_code
    _check_no_key_leaked_nor_locked(api, foreign, result, after)


def test_async_httpx_drops_the_key_on_a_cross_origin_redirect(
        servers: Tuple[_Hostile, _Hostile]) -> None:
    api, foreign = servers

    async def run() -> Tuple[Any, int]:
        async with AsyncRetryingClient(headers={"X-Api-Key": "key-a"}, follow_redirects=True,
                                       timeout=5) as c:
            try:
                result: Any = await c.get(api.base + "/redirect")
            except LockoutError as e:
                result = e
            return result, (await c.get(api.base + "/ok")).status_code

    result, after = asyncio.run(run())
    _check_no_key_leaked_nor_locked(api, foreign, result, after)


def test_requests_deadline_bounds_the_request(servers: Tuple[_Hostile, _Hostile]) -> None:
    api, _ = servers
    start = time.monotonic()
    with RetryingSession() as s, pytest.raises(requests.Timeout):
        s.get(api.base + "/stall", timeout=10, deadline=0.5)
    assert time.monotonic() - start < 3


def test_httpx_deadline_bounds_the_request(servers: Tuple[_Hostile, _Hostile]) -> None:
    api, _ = servers
    start = time.monotonic()
    with RetryingClient(timeout=10) as c, pytest.raises(httpx.TimeoutException):
        c.get(api.base + "/stall", deadline=0.5)
    assert time.monotonic() - start < 3


def test_async_httpx_deadline_bounds_the_request(servers: Tuple[_Hostile, _Hostile]) -> None:
    api, _ = servers

    async def run() -> None:
        async with AsyncRetryingClient(timeout=None) as c:
            await c.get(api.base + "/stall", deadline=0.5)

    start = time.monotonic()
    with pytest.raises(httpx.TimeoutException):
        asyncio.run(run())
    assert time.monotonic() - start < 3
