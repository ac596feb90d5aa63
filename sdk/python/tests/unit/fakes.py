"""Test doubles for the unit tests: a fake clock, a scripted random source,
and one driver per adapter (httpx sync, httpx async, requests) that sends
through a scripted server and records what was sent and slept."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import httpx
import requests
import requests.adapters
from requests.structures import CaseInsensitiveDict

from rl_client import AsyncRetryingClient, RetryingClient, RetryingSession


class FakeClock:
    """Monotonic and wall time that only move when something sleeps (or
    ``advance`` is called); records every sleep."""

    def __init__(self, wall: float = 1_700_000_000.0) -> None:
        self.now = 1000.0
        self.wall_now = wall
        self.sleeps: List[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall_now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_now += seconds

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.sleeps.append(seconds)
            self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class ScriptedRandom:
    """``uniform(a, b)`` returns ``a + fraction * (b - a)`` and records (a, b)."""

    def __init__(self, fraction: float = 1.0) -> None:
        self.fraction = fraction
        self.calls: List[Tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.calls.append((a, b))
        return a + self.fraction * (b - a)


@dataclass
class Reply:
    """One scripted response."""

    status: int = 200
    headers: Dict[str, str] = field(default_factory=dict)
    body: Any = None  # dict -> JSON (problem+json for >= 400), str -> text

    def encoded(self) -> Tuple[Dict[str, str], bytes]:
        headers = dict(self.headers)
        if isinstance(self.body, dict):
            ctype = "application/problem+json" if self.status >= 400 else "application/json"
            headers.setdefault("Content-Type", ctype)
            return headers, json.dumps(self.body).encode()
        return headers, (self.body or "").encode()


def throttled(retry_after: Optional[str] = "1", request_id: str = "req-1",
              status: int = 429, **headers: str) -> Reply:
    """A gateway-like 429 (or ``status``) with a problem body."""
    h = {k.replace("_", "-"): v for k, v in headers.items()}
    if retry_after is not None:
        h["Retry-After"] = retry_after
    return Reply(status, h, {"type": "https://api.example.com/problems/rate-limit-exceeded",
                             "status": status, "request_id": request_id})


@dataclass
class Sent:
    """What the scripted server received."""

    method: str
    path: str
    headers: Dict[str, str]
    body: bytes


class Server:
    """Answers with the scripted replies in order (the last one repeats)."""

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self.sent: List[Sent] = []

    def answer(self, method: str, path: str, headers: Dict[str, str], body: bytes) -> Reply:
        self.sent.append(Sent(method, path, {k.lower(): v for k, v in headers.items()}, body))
        return self.replies[min(len(self.sent) - 1, len(self.replies) - 1)]


BASE = "http://api.test"


def _httpx_handler(server: Server) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        reply = server.answer(request.method, request.url.path, dict(request.headers),
                              request.read())
        headers, body = reply.encoded()
        return httpx.Response(reply.status, headers=headers, content=body)
    return handle


class _RequestsAdapter(requests.adapters.BaseAdapter):
    def __init__(self, server: Server) -> None:
        super().__init__()
        self.server = server

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode()
        path = (request.path_url or "/").split("?")[0]
        reply = self.server.answer(request.method or "GET", path, dict(request.headers),
                                   body)
        headers, content = reply.encoded()
        resp = requests.Response()
        resp.status_code = reply.status
        resp.headers = CaseInsensitiveDict(headers)
        resp.raw = io.BytesIO(content)
        resp.url = request.url or ""
        resp.request = request
        return resp

    def close(self) -> None:
        pass


ADAPTERS = ("httpx", "httpx-async", "requests")


class Driver:
    """One client of the chosen adapter over a scripted server.

    ``call(method, path, **kw)`` returns the response or the raised
    exception; ``server.sent`` and ``clock.sleeps`` tell what happened."""

    def __init__(self, adapter: str, replies: Sequence[Reply], *,
                 rng: Optional[ScriptedRandom] = None, clock: Optional[FakeClock] = None,
                 headers: Optional[Dict[str, str]] = None, **options: Any) -> None:
        self.adapter = adapter
        self.server = Server(replies)
        self.clock = clock or FakeClock()
        self.rng = rng or ScriptedRandom()
        common: Dict[str, Any] = dict(clock=self.clock, rng=self.rng, **options)
        hdrs = headers if headers is not None else {"X-Api-Key": "key-a"}
        if adapter == "httpx":
            self.client: Any = RetryingClient(
                httpx.Client(transport=httpx.MockTransport(_httpx_handler(self.server)),
                             base_url=BASE, headers=hdrs), **common)
        elif adapter == "httpx-async":
            self.client = AsyncRetryingClient(
                httpx.AsyncClient(transport=httpx.MockTransport(_httpx_handler(self.server)),
                                  base_url=BASE, headers=hdrs), **common)
        else:
            session = RetryingSession(**common)
            session.headers.update(hdrs)
            session.mount(BASE, _RequestsAdapter(self.server))
            self.client = session

    @property
    def engine(self) -> Any:
        return self.client.engine

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """The response, or the exception the call raised."""
        try:
            if self.adapter == "httpx-async":
                return asyncio.run(self.client.request(method, path, **kw))
            url = BASE + path if self.adapter == "requests" else path
            return self.client.request(method, url, **kw)
        except Exception as e:  # the tests assert on it
            return e


def status_of(resp: Any) -> int:
    """The status of an httpx or requests response."""
    return int(getattr(resp, "status_code"))
