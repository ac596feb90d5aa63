"""An ASGI middleware for Starlette and FastAPI that gives each declared
route all of rl: buckets, windows and calendar quotas (several at once,
all-or-nothing), a request cost, the penalty box, concurrency leases held
for the request (released when it ends, fails or the client leaves), a
per-resource lock answered 409 at once, a required Idempotency-Key, shadow
mode, and per route what happens when Redis fails (503, or an in-process
limiter marked degraded). Responses carry the gateway's RateLimit-Policy,
RateLimit and Retry-After fields and its problem bodies.

    app.add_middleware(RateLimitMiddleware, redis="redis://127.0.0.1:6379",
                       routes={"POST /payments": Route(rates=[Rate(...)])})

Runs on asyncio (uvicorn's default loop)."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple

import redis
import redis.asyncio as aioredis
from starlette.requests import Request

from . import commands, responses
from .client import AsyncRL
from .commands import Command
from .decisions import Decision, Status
from .fallback import LocalLimiter
from .responses import Binding, Policy
from .routes import (Concurrency, Quota, Rate, Route, Window, compile_routes, cost_of, keyed, match,
                     window_seconds)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("rl_server")
#: what a Redis call that failed raises (an error reply is a RedisError too)
REDIS_FAILURES = (redis.RedisError, OSError, asyncio.TimeoutError)
_KIND = {Rate: "rate", Window: "window", Quota: "quota"}


@dataclass
class _Outcome:
    """What the limiters decided for one request."""

    headers: Dict[str, str] = field(default_factory=dict)
    #: granted leases: (key, lease id, ttl), released when the request ends
    leases: List[Tuple[str, str, float]] = field(default_factory=list)
    #: local leases (a degraded answer): keys
    local_leases: List[str] = field(default_factory=list)
    #: a refusal: status and problem body
    status: Optional[int] = None
    body: Optional[Dict[str, Any]] = None


class RateLimitMiddleware:
    """The middleware; ``routes`` maps ``"METHOD /template/{param}"`` (or
    ``"/template"``, any method) to a ``Route``. Undeclared routes pass."""

    def __init__(self, app: ASGIApp, *, redis: Any, routes: Mapping[str, Route],
                 problem_base: str = "https://api.example.com/problems", timeout: float = 0.25,
                 fail_closed_retry_after: int = 15, fallback_ratio: float = 0.5,
                 legacy_headers: bool = False, http_date_after: float = 3600,
                 manual_box_status: int = 403, shadow: bool = False,
                 request_id_header: str = "x-request-id") -> None:
        """``redis``: a URL, or a ``redis.asyncio`` client (Redis or RedisCluster);
        ``timeout``: seconds a Redis call may take before the route's failure mode
        applies. Bad options raise ValueError naming them."""
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(f"timeout must be seconds greater than 0, got {timeout!r}")
        if not isinstance(fail_closed_retry_after, int) or fail_closed_retry_after < 1:
            raise ValueError(f"fail_closed_retry_after must be an integer >= 1 (seconds), "
                             f"got {fail_closed_retry_after!r}")
        if isinstance(fallback_ratio, bool) or not isinstance(fallback_ratio, (int, float)) \
                or not 0 < fallback_ratio <= 1:
            raise ValueError(f"fallback_ratio must be in (0, 1], got {fallback_ratio!r}")
        if manual_box_status not in (403, 429):
            raise ValueError(f"manual_box_status must be 403 or 429, got {manual_box_status!r}")
        if not isinstance(problem_base, str) or not problem_base:
            raise ValueError("problem_base must be a non-empty URL")
        if isinstance(redis, str):
            if not redis.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError(f"redis must be a redis:// URL or a redis.asyncio client, got {redis!r}")
            redis = aioredis.Redis.from_url(redis, socket_timeout=timeout, socket_connect_timeout=timeout)
        elif not hasattr(redis, "execute_command"):
            raise ValueError(f"redis must be a redis:// URL or a redis.asyncio client, got {redis!r}")
        self.app = app
        self.rl = AsyncRL(redis)
        self.routes = compile_routes(routes)
        self.problem_base = problem_base.rstrip("/")
        self.timeout = float(timeout)
        self.fail_closed_retry_after = fail_closed_retry_after
        self.fallback_ratio = fallback_ratio
        self.legacy_headers = legacy_headers
        self.http_date_after = http_date_after
        self.manual_box_status = manual_box_status
        self.shadow = shadow
        self.request_id_header = request_id_header.lower().encode("latin-1")
        self.local = LocalLimiter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        found = match(self.routes, scope["method"], scope["path"])
        if found is None:
            return await self.app(scope, receive, send)
        compiled, params = found
        route = compiled.route
        request = Request({**scope, "path_params": params})
        rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == self.request_id_header),
                   None) or uuid.uuid4().hex
        shadow = self.shadow or route.shadow
        if route.idempotency_key and not request.headers.get("idempotency-key"):
            out = _Outcome(status=400, body=responses.problem(
                self.problem_base, 400, "idempotency-key-required",
                "This route requires an Idempotency-Key header: send one unique key per operation "
                "and the same key on its retries.", instance=scope["path"], request_id=rid,
                tier=route.tier))
        else:
            try:
                out = await self._decide(route, request, params, rid)
            except REDIS_FAILURES as err:
                log.warning("rl: Redis failed on %s (%s): %s", compiled.name, route.on_redis_failure, err)
                out = self._redis_failed(route, request, params, rid)
        if out.status is not None:
            if not shadow:
                await self._release(out)
                assert out.body is not None
                return await self._answer(send, out.status, out.headers, out.body)
            log.info("rl shadow: %s %s would be answered %s (%s)", scope["method"], scope["path"],
                     out.status, out.body.get("policy") if out.body else None)
            out.headers = {}
        elif shadow:
            out.headers = {}
        await self._run(scope, receive, send, out)

    # -- deciding ---------------------------------------------------------

    async def _call(self, command: Command[Any]) -> Any:
        return await asyncio.wait_for(self.rl.run(command), self.timeout)

    async def _decide(self, route: Route, request: Request, params: Mapping[str, str],
                      rid: str) -> _Outcome:
        out = _Outcome()
        policies: List[Policy] = []
        try:
            for lease, key in zip(route.leases, keyed(route.leases, request, params)):
                policies.append(Policy(lease.name, lease.max, None, "concurrent-requests"))
                lid = uuid.uuid4().hex
                # recorded before the call: a timed-out ACQUIRE may have been granted
                out.leases.append((key, lid, float(lease.ttl)))
                got = await self._call(commands.lease_acquire(key, lease.max, lease.ttl, lid))
                if not got.granted:
                    out.leases.pop()
                    self._lease_refusal(out, route, request, rid, lease, got.retry_after_ms, policies)
                    return out
            cost = await cost_of(route.cost, request)
            refunds: List[Command[Decision]] = []
            bindings: List[Binding] = []
            penalty = route.penalty
            groups: Tuple[Sequence[Any], ...] = (route.rates, route.windows, route.quotas)
            for items in groups:
                if not items:
                    continue
                keys = keyed(items, request, params)
                policies += [Policy(i.name, _quota_of(i), window_seconds(i), route.unit) for i in items]
                smallest = min(range(len(items)), key=lambda j: _capacity_of(items[j]))
                if cost > _capacity_of(items[smallest]):
                    # above a capacity: it never fits (rl refuses such a COST as an error)
                    await self._refund(refunds)
                    b = items[smallest]
                    never = Decision(Status.THROTTLED, _capacity_of(b), 0, -1, -1, 0, None, smallest)
                    self._limiter_refusal(out, route, request, rid, b, never,
                                          Binding(b.name, never.limit, 0, None, window_seconds(b)),
                                          cost, policies)
                    return out
                cmd, refund = _limiter_commands(items, keys, cost, penalty)
                penalty = None
                d: Decision = await self._call(cmd)
                b = items[d.binding]
                binding = Binding(b.name, d.limit, 0 if d.status is Status.BOXED else d.remaining,
                                  d.reset_ms, window_seconds(b), clamp=not isinstance(b, Rate),
                                  boxed=d.status is Status.BOXED)
                if not d.allowed:
                    await self._refund(refunds)
                    self._limiter_refusal(out, route, request, rid, b, d, binding, cost, policies)
                    return out
                bindings.append(binding)
                if cost > 0:
                    refunds.append(refund)
        except BaseException:
            await self._release(out)
            raise
        _rate_headers(out.headers, policies, _tightest(bindings), self.legacy_headers)
        return out

    async def _refund(self, refunds: Sequence[Command[Decision]]) -> None:
        for cmd in refunds:  # a later limiter refused: give back what earlier ones took
            try:
                await self._call(cmd)
            except REDIS_FAILURES as err:
                log.warning("rl: refund failed: %s", err)

    def _lease_refusal(self, out: _Outcome, route: Route, request: Request, rid: str,
                       lease: Concurrency, earliest_left_ms: int, policies: List[Policy]) -> None:
        retry_ms = lease_retry_ms(float(lease.ttl), float(lease.expected), earliest_left_ms)
        secs = responses.seconds(retry_ms)
        _rate_headers(out.headers, policies, Binding(lease.name, lease.max, 0, None), self.legacy_headers)
        out.headers["Retry-After"] = str(secs)
        out.status = lease.status
        out.body = responses.problem(
            self.problem_base, lease.status, "concurrency-limit-exceeded",
            responses.lease_detail(lease.name, lease.max, secs), instance=request.url.path,
            request_id=rid, retry_after_s=secs, tier=route.tier, policy=lease.name,
            concurrency_limit=lease.max)

    def _limiter_refusal(self, out: _Outcome, route: Route, request: Request, rid: str, item: Any,
                         d: Decision, binding: Binding, cost: int, policies: List[Policy]) -> None:
        _rate_headers(out.headers, policies, binding, self.legacy_headers)
        boxed = d.status is Status.BOXED
        retry_ms = None if d.retry_after_ms < 0 else d.retry_after_ms
        secs = None if retry_ms is None else responses.seconds(retry_ms)
        status = 403 if isinstance(item, Quota) else 429
        kind = "quota-exceeded" if isinstance(item, Quota) else "rate-limit-exceeded"
        if boxed:
            kind = "penalty-box-active"
            status = 429 if retry_ms is not None else self.manual_box_status
            out.headers["X-Penalty-Box-Status"] = "Active-Lockout"
            box = route.penalty.box if route.penalty and route.penalty.box else (300, 3600, 86400)
            length = box[d.box_level - 1] if 1 <= d.box_level <= 3 else 0
            value = responses.retry_after(retry_ms, as_date=length >= self.http_date_after)
            detail = responses.boxed_detail(item.name, d.box_level, secs)
        else:
            threshold = route.penalty.threshold if route.penalty else None
            if d.strikes_remaining is not None and threshold and d.strikes_remaining < threshold:
                out.headers["X-Penalty-Box-Status"] = "Warning"
            value = responses.retry_after(retry_ms)
            detail = responses.rate_detail(item.name, d.limit, route.unit, window_seconds(item), cost, secs)
        if value is not None:
            out.headers["Retry-After"] = value
        out.status = status
        out.body = responses.problem(
            self.problem_base, status, kind, detail, instance=request.url.path, request_id=rid,
            retry_after_s=secs, tier=route.tier, policy=item.name, strikes=d.strikes_remaining,
            boxed=boxed, level=d.box_level or None,
            lockout_ends_at=responses.timestamp(responses.ends_at(retry_ms))
            if boxed and retry_ms is not None else None)

    def _redis_failed(self, route: Route, request: Request, params: Mapping[str, str],
                      rid: str) -> _Outcome:
        """Redis failed: 503 for a route that fails closed; else the local limiter."""
        if route.on_redis_failure == "closed":
            wait = self.fail_closed_retry_after
            return _Outcome(headers={"Retry-After": str(wait)}, status=503, body=responses.problem(
                self.problem_base, 503, "rate-limiter-unavailable", responses.fail_closed_detail(wait),
                instance=request.url.path, request_id=rid, tier=route.tier))
        out = _Outcome(headers={responses.DEGRADED: responses.DEGRADED_VALUE})
        for lease, key in zip(route.leases, keyed(route.leases, request, params)):
            if not self.local.acquire(key, lease.max):
                for k in out.local_leases:
                    self.local.release(k)
                out.local_leases = []
                self._local_refusal(out, route, request, rid, lease.name + "-degraded", lease.status,
                                    "concurrency-limit-exceeded", 1000, concurrency=lease.max)
                return out
            out.local_leases.append(key)
        buckets, names = [], []
        local: List[Any] = [*route.rates, *route.windows]
        for item, key in zip(local, keyed(local, request, params)):
            cap = item.capacity if isinstance(item, Rate) else item.limit
            rate = item.tokens if isinstance(item, Rate) else item.limit
            buckets.append((key, max(math.floor(cap * self.fallback_ratio), 1),
                            max(math.floor(rate * self.fallback_ratio), 1), window_seconds(item)))
            names.append(item.name + "-degraded")
        if buckets:
            cost = route.cost if isinstance(route.cost, int) else 1
            ds = self.local.take(buckets, min(cost, min(b[1] for b in buckets)))
            if not ds[0].allowed:
                i = max(range(len(ds)), key=lambda j: ds[j].retry_after_ms)
                for k in out.local_leases:
                    self.local.release(k)
                out.local_leases = []
                out.headers["RateLimit"] = responses.ratelimit_fields(
                    Binding(names[i], ds[i].limit, ds[i].remaining, ds[i].reset_ms))["RateLimit"]
                self._local_refusal(out, route, request, rid, names[i], 429, "rate-limit-exceeded",
                                    ds[i].retry_after_ms)
                return out
        return out

    def _local_refusal(self, out: _Outcome, route: Route, request: Request, rid: str, name: str,
                       status: int, kind: str, retry_ms: int, concurrency: Optional[int] = None) -> None:
        secs = responses.seconds(retry_ms)
        out.headers["Retry-After"] = str(secs)
        out.status = status
        out.body = responses.problem(
            self.problem_base, status, kind, f"{name}: the rate limiter answers locally while it is "
            f"unavailable; retry in {secs} s.", instance=request.url.path, request_id=rid,
            retry_after_s=secs, tier=route.tier, policy=name, concurrency_limit=concurrency,
            degraded=responses.DEGRADED_VALUE)

    # -- answering and running the app ----------------------------------

    async def _answer(self, send: Send, status: int, fields: Mapping[str, str],
                      body: Mapping[str, Any]) -> None:
        data = responses.encode(body)
        headers = responses.header_list({**fields, "Content-Type": responses.CONTENT_TYPE})
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _run(self, scope: Scope, receive: Receive, send: Send, out: _Outcome) -> None:
        """Runs the app with the decided fields added to its response; the
        leases are renewed while it runs and released when it ends, fails, or
        the client leaves (the app is then cancelled)."""
        extra = responses.header_list(out.headers)

        async def send_with_fields(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # given back before the response ends: a client that calls
                # again as soon as it has the answer finds the slot free
                await self._release(out)
            await send(message)

        if not out.leases and not out.local_leases:
            return await self.app(scope, receive, send_with_fields)
        queue: asyncio.Queue[Message] = asyncio.Queue()
        gone = asyncio.Event()

        async def pump() -> None:
            while True:
                message = await receive()
                await queue.put(message)
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        app = asyncio.ensure_future(self.app(scope, queue.get, send_with_fields))
        helpers = [asyncio.ensure_future(pump()), asyncio.ensure_future(self._renew(out.leases))]
        left = asyncio.ensure_future(gone.wait())
        try:
            done, _ = await asyncio.wait({app, left}, return_when=asyncio.FIRST_COMPLETED)
            if app in done:
                app.result()  # the app's own exception, if any
            else:
                log.info("rl: the client left %s %s: request cancelled, leases released",
                         scope["method"], scope["path"])
                app.cancel()
                await asyncio.wait({app}, timeout=self.timeout + 5)
        finally:
            for t in (*helpers, left):
                t.cancel()
            if not app.done():
                app.cancel()
            await self._release(out)

    async def _renew(self, leases: Sequence[Tuple[str, str, float]]) -> None:
        if not leases:
            return
        every = min(ttl for _, _, ttl in leases) / 3
        while True:
            await asyncio.sleep(every)
            for key, lid, ttl in leases:
                try:
                    await self._call(commands.lease_renew(key, lid, ttl))
                except REDIS_FAILURES as err:
                    log.warning("rl: lease renewal failed: %s", err)

    async def _release(self, out: _Outcome) -> None:
        for key in out.local_leases:
            self.local.release(key)
        out.local_leases = []
        leases, out.leases = out.leases, []
        for key, lid, _ in reversed(leases):
            try:  # shielded: a cancelled request still gives its slot back
                await asyncio.shield(self._call(commands.lease_release(key, lid)))
            except REDIS_FAILURES as err:
                log.warning("rl: lease release failed (it expires with its ttl): %s", err)


async def _unused_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("the options check's app is never called")


def install(app: Any, **options: Any) -> None:
    """``app.add_middleware(RateLimitMiddleware, **options)``, the options
    checked now: a bad one raises ValueError naming it when the app is made,
    so the server refuses to start (Starlette builds its middleware only at
    the first event, and uvicorn's lifespan "auto" mode goes on past it)."""
    RateLimitMiddleware(_unused_app, **options)
    app.add_middleware(RateLimitMiddleware, **options)


def _capacity_of(item: Any) -> int:
    return int(item.capacity) if isinstance(item, Rate) else int(item.limit)


def _quota_of(item: Any) -> int:
    return int(item.tokens) if isinstance(item, Rate) else int(item.limit)


def _limiter_commands(items: Sequence[Any], keys: Sequence[str], cost: int,
                      penalty: Optional[commands.Penalty]) -> Tuple[Command[Decision], Command[Decision]]:
    """The command of one group (rates, windows or quotas: the first and its
    ALSO), and the refund that gives ``cost`` back."""
    first = items[0]
    if isinstance(first, Rate):
        bs = [commands.Bucket(k, i.capacity, i.tokens, i.period) for i, k in zip(items, keys)]
        return (commands.take(bs[0], *bs[1:], cost=cost, penalty=penalty),
                commands.take(bs[0], *bs[1:], refund=max(cost, 1)))
    if isinstance(first, Window):
        ws = [commands.Window(k, i.limit, i.window) for i, k in zip(items, keys)]
        return (commands.window(ws[0], *ws[1:], cost=cost, mode=first.mode, penalty=penalty),
                commands.window(ws[0], *ws[1:], mode=first.mode, refund=max(cost, 1)))
    qs = [commands.Quota(k, i.limit, i.period) for i, k in zip(items, keys)]
    return (commands.quota(qs[0], *qs[1:], cost=cost, penalty=penalty),
            commands.quota(qs[0], *qs[1:], refund=max(cost, 1)))


def _tightest(bindings: Sequence[Binding]) -> Optional[Binding]:
    """The binding with the smallest share left (the first on a tie)."""
    best: Optional[Binding] = None
    for b in bindings:
        if best is None or b.remaining / max(b.limit, 1) < best.remaining / max(best.limit, 1):
            best = b
    return best


def _rate_headers(fields: Dict[str, str], policies: Sequence[Policy], binding: Optional[Binding],
                  legacy: bool) -> None:
    if policies:
        fields["RateLimit-Policy"] = responses.policy_field(policies)
    if binding is not None:
        fields.update(responses.ratelimit_fields(binding, legacy))


def lease_retry_ms(ttl: float, expected: float, earliest_left_ms: int) -> int:
    """The Retry-After (ms) of a full lease: the earliest holder's expected end
    (``expected`` seconds after it started: it started ``ttl - earliest_left``
    ago), at least 1 s, at most the earliest expiry; never the ttl itself."""
    elapsed = ttl * 1000 - earliest_left_ms
    retry = max(expected * 1000 - elapsed, 1000)
    return int(math.ceil(min(retry, max(earliest_left_ms, 1000))))
