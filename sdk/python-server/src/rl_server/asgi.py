"""An ASGI middleware for Starlette and FastAPI that gives each declared
route all of rl: buckets, windows and calendar quotas (several at once,
all-or-nothing), a request cost, the penalty box, concurrency leases held
for the request (released when it ends, fails or the client leaves), a
per-resource lock answered 409 at once, a required Idempotency-Key, shadow
mode, and per route what happens when Redis fails (503, or an in-process
limiter marked degraded; what a late reply or a failed request took is
given back). Responses carry the gateway's RateLimit-Policy, RateLimit and
Retry-After fields and its problem bodies.

    app.add_middleware(RateLimitMiddleware, redis="redis://127.0.0.1:6379",
                       routes={"POST /payments": Route(rates=[Rate(...)])})

Runs on asyncio (uvicorn's default loop)."""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import uuid
from dataclasses import dataclass, field
from typing import (Any, Awaitable, Callable, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple,
                    TypeVar)

import redis.asyncio as aioredis
from starlette.requests import Request

try:  # Starlette's own (0.33 and later), so that routes match as it routes
    from starlette._utils import get_route_path
except ImportError:  # pragma: no cover - an older Starlette
    def get_route_path(scope: MutableMapping[str, Any]) -> str:
        """The path without the root path, as Starlette routes on it."""
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root) and (path == root or path[len(root)] == "/"):
            return path[len(root):]
        return path

from . import commands, responses
from .client import AsyncRL
from .commands import Command
from .decisions import Decision, Lease, Status
from .fallback import LocalLimiter
from .late import REDIS_FAILURES, Background
from .responses import Binding, Policy
from .routes import (Concurrency, Quota, Rate, Route, Window, compile_routes, cost_of, keyed, match,
                     window_seconds)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

T = TypeVar("T")
#: (items, keys) of a group charged for a request: what a refund gives back
Charge = Tuple[Sequence[Any], List[str]]

log = logging.getLogger("rl_server")
#: most calls and refunds left running after their request, and their seconds
LATE_LIMIT, LATE_SECONDS = 1000, 10.0
_KIND = {Rate: "bucket", Window: "window", Quota: "quota"}


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
    ``"/template"``, any method) to a ``Route``, the template matched on the
    path as the app routes it (without the root path or a Mount's prefix).
    Undeclared routes pass."""

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
            # socket_timeout None: every call has the deadline of _call (a late
            # one the background's bound), and redis-py's own (5 s by default)
            # would cut a late reply short
            redis = aioredis.Redis.from_url(redis, socket_timeout=None, socket_connect_timeout=timeout)
        elif not hasattr(redis, "execute_command"):
            raise ValueError(f"redis must be a redis:// URL or a redis.asyncio client, got {redis!r}")
        self.app = app
        self.rl = AsyncRL(redis)
        self.routes = compile_routes(routes)
        self.conf = responses.Conf(problem_base.rstrip("/"), legacy_headers, http_date_after,
                                   manual_box_status, fail_closed_retry_after)
        self.timeout = float(timeout)
        self.fallback_ratio = fallback_ratio
        self.shadow = shadow
        self.request_id_header = request_id_header.lower().encode("latin-1")
        self.local = LocalLimiter()
        #: late calls and the refunds of failed requests
        self.late = Background(LATE_LIMIT, LATE_SECONDS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # the path Starlette routes on: without a proxy's root path
        # (uvicorn --root-path) or a Mount's prefix (a sub-app's middleware)
        found = match(self.routes, scope["method"], get_route_path(scope))
        if found is None:
            return await self.app(scope, receive, send)
        compiled, params = found
        route = compiled.route
        request = Request({**scope, "path_params": params})
        # the request's own id, if any: a refusal's body carries it (or a new one)
        given_rid = next((v.decode("latin-1") for k, v in scope["headers"]
                          if k == self.request_id_header), None)
        if route.idempotency_key and not request.headers.get("idempotency-key"):
            # a client error, not a limit: answered in shadow mode too (as the Node SDK)
            answer = responses.idempotency_required(self.conf, scope["path"],
                                                    responses.request_id(given_rid))
            assert answer.body is not None
            return await self._answer(send, answer.status, answer.headers, answer.body)
        shadow = self.shadow or route.shadow
        #: the request's cost once computed: the cost function runs once
        cost: List[int] = []
        try:
            out = await self._decide(route, request, params, given_rid, cost)
        except REDIS_FAILURES as err:
            log.warning("rl: Redis failed on %s (%s): %s", compiled.name, route.on_redis_failure, err)
            out = await self._redis_failed(route, request, params, given_rid, cost)
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

    async def _call(self, command: Command[T],
                    undo: Callable[[T], Optional[Command[Any]]] = lambda _: None) -> T:
        """``command``'s reply, or TimeoutError past ``timeout``. A call that
        timed out (or whose request was cancelled) may still run in Redis: it
        is let finish in the background, and ``undo`` of its reply (a
        command giving back what it took, or None) sent then."""
        call = asyncio.ensure_future(self.rl.run(command))
        try:
            return await self._wait(call)
        except BaseException:
            self.late.settle(call, lambda reply: self._maybe_run(undo(reply)), f"late {command.args[0]!s}")
            raise

    if sys.version_info >= (3, 11):
        async def _wait(self, call: "asyncio.Future[T]") -> T:
            # shielded: the deadline stops the wait, not the call
            async with asyncio.timeout(self.timeout):
                return await asyncio.shield(call)
    else:
        async def _wait(self, call: "asyncio.Future[T]") -> T:
            return await asyncio.wait_for(asyncio.shield(call), self.timeout)

    def _maybe_run(self, command: Optional[Command[Any]]) -> Optional[Awaitable[Any]]:
        return None if command is None else self.rl.run(command)

    async def _decide(self, route: Route, request: Request, params: Mapping[str, str],
                      given_rid: Optional[str], costs: List[int]) -> _Outcome:
        """The decision of Redis; the request's cost is appended to ``costs``
        once computed."""
        out = _Outcome()
        policies = route_policies(route)
        # the groups charged so far, given back if a later one refuses or fails
        refunds: List[Charge] = []
        cost = 0
        try:
            for lease, key in zip(route.leases, keyed(route.leases, request, params)):
                lid = uuid.uuid4().hex
                # recorded before the call: a timed-out ACQUIRE may have been granted
                out.leases.append((key, lid, float(lease.ttl)))
                got = await self._call(commands.lease_acquire(key, lease.max, lease.ttl, lid),
                                       _release_if_granted(key, lid))
                if not got.granted:
                    out.leases.pop()
                    await self._release(out)
                    return _refused(responses.lease_refusal(
                        self.conf, policies, lease.name, lease.max, float(lease.ttl),
                        float(lease.expected), lease.status, got.retry_after_ms, request.url.path,
                        responses.request_id(given_rid), route.tier))
            cost = await cost_of(route.cost, request)
            costs.append(cost)
            bindings: List[Binding] = []
            penalty = route.penalty
            groups: Tuple[Sequence[Any], ...] = (route.rates, route.windows, route.quotas)
            for items in groups:
                if not items:
                    continue
                smallest = min(range(len(items)), key=lambda j: _capacity_of(items[j]))
                if cost > _capacity_of(items[smallest]):
                    # above a capacity it never fits (rl refuses such a COST as an error)
                    b = items[smallest]
                    d = Decision(Status.THROTTLED, _capacity_of(b), 0, -1, -1, 0, None, smallest)
                else:
                    keys = keyed(items, request, params)
                    d = await self._call(_group_command(items, keys, cost=cost, penalty=penalty),
                                         _refund_if_allowed(items, keys, cost))
                    b = items[d.binding]
                    if d.allowed and cost > 0:
                        refunds.append((items, keys))
                penalty = None
                boxed = d.status is Status.BOXED
                binding = Binding(b.name, d.limit, 0 if boxed else d.remaining,
                                  None if d.reset_ms < 0 else d.reset_ms, window_seconds(b),
                                  clamp=not isinstance(b, Rate), boxed=boxed)
                if not d.allowed:
                    await self._refund(refunds, cost)
                    await self._release(out)
                    return _refused(responses.limiter_refusal(
                        self.conf, policies, _limiter_view(route, b, cost), binding, d.box_level,
                        d.retry_after_ms, d.strikes_remaining, request.url.path,
                        responses.request_id(given_rid), route.tier))
                bindings.append(binding)
        except BaseException:
            if refunds:  # in the background: the request is answered without waiting for Redis
                self.late.spawn(self._refund(refunds, cost), "refund of a failed request")
            await self._release(out)
            raise
        out.headers = responses.admitted(self.conf, policies, _tightest(bindings)).headers
        return out

    async def _refund(self, refunds: List[Charge], cost: int) -> None:
        """Gives back what the groups of ``refunds`` took, each once: a group
        leaves the list as its refund is sent (a refund cut short by a
        cancellation finishes in the background, the rest stay listed)."""
        while refunds:
            items, keys = refunds.pop(0)
            try:
                await self._call(_group_command(items, keys, refund=cost))
            except REDIS_FAILURES as err:
                log.warning("rl: refund failed: %s", err)

    async def _redis_failed(self, route: Route, request: Request, params: Mapping[str, str],
                            given_rid: Optional[str], costs: List[int]) -> _Outcome:
        """Redis failed: 503 for a route that fails closed; else the local
        limiter, charging the request's cost (``costs``: the one computed
        before Redis failed, if any)."""
        if route.on_redis_failure == "closed":
            return _refused(responses.fail_closed(self.conf, request.url.path,
                                                  responses.request_id(given_rid), route.tier))
        local: List[Any] = [*route.rates, *route.windows]
        # before the local leases: a cost function that raises holds none
        cost = (costs[0] if costs else await cost_of(route.cost, request)) if local else 0
        out = _Outcome(headers={responses.DEGRADED: responses.DEGRADED_VALUE})
        for lease, key in zip(route.leases, keyed(route.leases, request, params)):
            if not self.local.acquire(key, lease.max):
                for k in out.local_leases:
                    self.local.release(k)
                out.local_leases = []
                self._local_refusal(out, route, request, given_rid, lease.name + "-degraded", lease.status,
                                    "concurrency-limit-exceeded", 1000, concurrency=lease.max)
                return out
            out.local_leases.append(key)
        buckets, names = [], []
        for item, key in zip(local, keyed(local, request, params)):
            cap = item.capacity if isinstance(item, Rate) else item.limit
            rate = item.tokens if isinstance(item, Rate) else item.limit
            buckets.append((key, max(math.floor(cap * self.fallback_ratio), 1),
                            max(math.floor(rate * self.fallback_ratio), 1), window_seconds(item)))
            names.append(item.name + "-degraded")
        if buckets:
            ds = self.local.take(buckets, min(cost, min(b[1] for b in buckets)))
            if not ds[0].allowed:
                i = max(range(len(ds)), key=lambda j: ds[j].retry_after_ms)
                for k in out.local_leases:
                    self.local.release(k)
                out.local_leases = []
                out.headers["RateLimit"] = responses.ratelimit_fields(
                    Binding(names[i], ds[i].limit, ds[i].remaining, ds[i].reset_ms))["RateLimit"]
                self._local_refusal(out, route, request, given_rid, names[i], 429, "rate-limit-exceeded",
                                    ds[i].retry_after_ms)
                return out
        return out

    def _local_refusal(self, out: _Outcome, route: Route, request: Request, given_rid: Optional[str], name: str,
                       status: int, kind: str, retry_ms: int, concurrency: Optional[int] = None) -> None:
        secs = responses.seconds(retry_ms)
        out.headers["Retry-After"] = str(secs)
        out.status = status
        out.body = responses.problem(
            self.conf.problem_base, status, kind, f"{name}: the rate limiter answers locally while it is "
            f"unavailable; retry in {secs} s.", instance=request.url.path, request_id=responses.request_id(given_rid),
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
            try:  # a cancelled request's release still runs (in the background)
                await self._call(commands.lease_release(key, lid))
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


def _refused(answer: responses.Answer) -> _Outcome:
    return _Outcome(headers=answer.headers, status=answer.status, body=answer.body)


def route_policies(route: Route) -> List[Policy]:
    """The RateLimit-Policy items of a route: rates, windows, quotas, then leases."""
    items: List[Any] = [*route.rates, *route.windows, *route.quotas]
    return [*(Policy(i.name, _quota_of(i), window_seconds(i), route.unit) for i in items),
            *(Policy(c.name, c.max, None, "concurrent-requests") for c in route.leases)]


def _limiter_view(route: Route, item: Any, cost: int) -> responses.Limiter:
    """What a refusal says of ``item``."""
    pen = route.penalty
    return responses.Limiter(
        item.name, _KIND[type(item)], route.unit, window_seconds(item), cost,
        box=pen.box if pen and pen.box else None,
        strikes_threshold=pen.threshold if pen else None,
        upgrade_url=item.upgrade_url if isinstance(item, Quota) else None)


def _capacity_of(item: Any) -> int:
    return int(item.capacity) if isinstance(item, Rate) else int(item.limit)


def _quota_of(item: Any) -> int:
    return int(item.tokens) if isinstance(item, Rate) else int(item.limit)


def _group_command(items: Sequence[Any], keys: Sequence[str], cost: int = 1,
                   penalty: Optional[commands.Penalty] = None, refund: Optional[int] = None
                   ) -> Command[Decision]:
    """The command of one group (rates, windows or quotas: the first and its
    ALSO): charging ``cost``, or with ``refund`` giving those points back."""
    first = items[0]
    if isinstance(first, Rate):
        bs = [commands.Bucket(k, i.capacity, i.tokens, i.period) for i, k in zip(items, keys)]
        return commands.take(bs[0], *bs[1:], cost=cost, penalty=penalty, refund=refund)
    if isinstance(first, Window):
        ws = [commands.Window(k, i.limit, i.window) for i, k in zip(items, keys)]
        return commands.window(ws[0], *ws[1:], cost=cost, mode=first.mode, penalty=penalty, refund=refund)
    qs = [commands.Quota(k, i.limit, i.period) for i, k in zip(items, keys)]
    return commands.quota(qs[0], *qs[1:], cost=cost, penalty=penalty, refund=refund)


def _refund_if_allowed(items: Sequence[Any], keys: Sequence[str], cost: int
                       ) -> Callable[[Decision], Optional[Command[Decision]]]:
    """What gives back a group's charge that turns out to have been allowed."""
    return lambda d: _group_command(items, keys, refund=cost) if d.allowed and cost > 0 else None


def _release_if_granted(key: str, lid: str) -> Callable[[Lease], Optional[Command[bool]]]:
    """What gives back a lease that turns out to have been granted."""
    return lambda got: commands.lease_release(key, lid) if got.granted else None


def _tightest(bindings: Sequence[Binding]) -> Optional[Binding]:
    """The binding with the smallest share left (the first on a tie)."""
    best: Optional[Binding] = None
    for b in bindings:
        if best is None or b.remaining / max(b.limit, 1) < best.remaining / max(best.limit, 1):
            best = b
    return best
