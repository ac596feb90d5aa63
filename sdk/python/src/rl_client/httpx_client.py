"""httpx clients (sync and async) that retry by the rl rules.

``RetryingClient`` wraps an :class:`httpx.Client`, ``AsyncRetryingClient``
an :class:`httpx.AsyncClient`. Each request is built once and sent again
as it is (same body, same credentials, same Idempotency-Key); a request
whose body is a one-shot stream cannot be sent twice (httpx raises).

A ``deadline`` also bounds each attempt: every timeout of the request
(connect, read, write, pool) becomes at most the time left (httpx then
raises its own ``TimeoutException``). With ``follow_redirects``, a redirect
to another origin drops the policy's ``lockout_key_headers`` (the API key),
not only ``Authorization``: the clients add a request event hook for it.
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Dict, Optional, Union

import httpx

from .clock import Clock, Random
from .engine import (Call, LockoutRegistry, ResponseView, RetryEngine, RetryPolicy, origin_of,
                     run_sync)
from .headers import RateLimitInfo
from .pacing import Pacer

#: The caller's hook for a 409 (a concurrency conflict): polls the job that
#: holds the resource and returns the response to give back, instead of
#: submitting again.
ConflictHook = Callable[[httpx.Response], httpx.Response]
AsyncConflictHook = Callable[[httpx.Response], Union[httpx.Response, Awaitable[httpx.Response]]]


#: The request extension that carries the origin a call started at.
_ORIGIN_EXTENSION = "rl_client.origin"


def _view(resp: httpx.Response, read: Callable[[], bytes]) -> ResponseView:
    return ResponseView(resp.status_code, resp.headers.get, read, str(resp.url))


def _bound_timeouts(request: httpx.Request, timeouts: Dict[str, Optional[float]],
                    call: Call) -> None:
    """Sets the request's timeouts for the next attempt: ``timeouts`` (as
    built), each at most the time left before the call's deadline."""
    left = call.attempt_timeout()
    if left is None:
        return
    bounded = {k: left if v is None else min(v, left) for k, v in timeouts.items()}
    request.extensions = {**request.extensions, "timeout": bounded}


class _Base:
    """What the sync and async clients share: the engine and its options."""

    def __init__(
        self,
        policy: Optional[RetryPolicy],
        clock: Optional[Clock],
        rng: Optional[Random],
        lockouts: Optional[LockoutRegistry],
        pacer: Optional[Pacer],
        new_idempotency_key: Optional[Callable[[], str]],
    ) -> None:
        extra = {"new_idempotency_key": new_idempotency_key} if new_idempotency_key else {}
        self.engine = RetryEngine(policy, clock=clock, rng=rng, lockouts=lockouts, pacer=pacer,
                                  **extra)

    def _drop_keys_cross_origin(self, request: httpx.Request) -> None:
        """The request event hook: a request (a redirect) that left the
        call's origin goes without the lockout key headers."""
        origin = request.extensions.get(_ORIGIN_EXTENSION)
        if origin is not None and origin_of(str(request.url)) != origin:
            for name in self.engine.policy.lockout_key_headers:
                request.headers.pop(name, None)

    def _install_hook(self, client: Union[httpx.Client, httpx.AsyncClient], hook: Any) -> None:
        hooks = client.event_hooks
        client.event_hooks = {**hooks, "request": [*hooks.get("request", []), hook]}

    @property
    def rate_limit(self) -> Optional[RateLimitInfo]:
        """The ``RateLimit`` / ``RateLimit-Policy`` fields of the latest response."""
        return self.engine.rate_limit

    def _begin(self, request: httpx.Request, deadline: Optional[float],
               idempotency_key: "str | bool | None", hook: Any,
               cost: float) -> "tuple[Call, Dict[str, Optional[float]]]":
        """The call, and the request's timeouts as built."""
        origin = origin_of(str(request.url))
        request.extensions = {**request.extensions, _ORIGIN_EXTENSION: origin}
        call = self.engine.begin(request.method, request.url.path, request.headers,
                                 deadline=deadline, idempotency_key=idempotency_key,
                                 has_conflict_hook=hook is not None, cost=cost, origin=origin)
        return call, dict(request.extensions.get("timeout") or {})


class RetryingClient(_Base):
    """A sync httpx client that retries throttled requests by the rl rules.

    ``client``: the :class:`httpx.Client` to send with (else one is made
    from ``client_kwargs``, e.g. ``base_url``, ``headers``). ``on_conflict``:
    default 409 hook. ``policy``, ``clock``, ``rng``, ``lockouts``, ``pacer``,
    ``new_idempotency_key``: see :class:`rl_client.RetryEngine`.
    """

    def __init__(
        self,
        client: Optional[httpx.Client] = None,
        *,
        policy: Optional[RetryPolicy] = None,
        clock: Optional[Clock] = None,
        rng: Optional[Random] = None,
        lockouts: Optional[LockoutRegistry] = None,
        pacer: Optional[Pacer] = None,
        on_conflict: Optional[ConflictHook] = None,
        new_idempotency_key: Optional[Callable[[], str]] = None,
        **client_kwargs: Any,
    ) -> None:
        super().__init__(policy, clock, rng, lockouts, pacer, new_idempotency_key)
        self.client = client if client is not None else httpx.Client(**client_kwargs)
        self._install_hook(self.client, self._drop_keys_cross_origin)
        self.on_conflict = on_conflict

    def request(
        self,
        method: str,
        url: Union[httpx.URL, str],
        *,
        deadline: Optional[float] = None,
        idempotency_key: "str | bool | None" = None,
        on_conflict: Optional[ConflictHook] = None,
        cost: float = 1.0,
        **kwargs: Any,
    ) -> httpx.Response:
        """Sends a request, retrying by the policy. ``deadline``: seconds this
        call may take in all; ``idempotency_key``: a key, or True to generate
        one; ``on_conflict``: this call's 409 hook; ``cost``: its points (for
        the pacer); ``kwargs``: :meth:`httpx.Client.build_request`'s.
        Raises :class:`rl_client.RateLimitError` for a throttled answer it
        gives up on."""
        request = self.client.build_request(method, url, **kwargs)
        hook = on_conflict or self.on_conflict
        call, timeouts = self._begin(request, deadline, idempotency_key, hook, cost)

        def attempt() -> httpx.Response:
            _bound_timeouts(request, timeouts, call)
            return self.client.send(request)

        return run_sync(call, attempt, lambda r: _view(r, r.read), httpx.Response.close, hook)

    def get(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("GET", url, ...)``."""
        return self.request("GET", url, **kwargs)

    def head(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("HEAD", url, ...)``."""
        return self.request("HEAD", url, **kwargs)

    def post(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("POST", url, ...)``."""
        return self.request("POST", url, **kwargs)

    def put(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("PUT", url, ...)``."""
        return self.request("PUT", url, **kwargs)

    def patch(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("PATCH", url, ...)``."""
        return self.request("PATCH", url, **kwargs)

    def delete(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("DELETE", url, ...)``."""
        return self.request("DELETE", url, **kwargs)

    def close(self) -> None:
        """Closes the underlying client."""
        self.client.close()

    def __enter__(self) -> "RetryingClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRetryingClient(_Base):
    """The async twin of :class:`RetryingClient`, over :class:`httpx.AsyncClient`
    (waits with ``clock.asleep``; the 409 hook may be a coroutine function)."""

    def __init__(
        self,
        client: Optional[httpx.AsyncClient] = None,
        *,
        policy: Optional[RetryPolicy] = None,
        clock: Optional[Clock] = None,
        rng: Optional[Random] = None,
        lockouts: Optional[LockoutRegistry] = None,
        pacer: Optional[Pacer] = None,
        on_conflict: Optional[AsyncConflictHook] = None,
        new_idempotency_key: Optional[Callable[[], str]] = None,
        **client_kwargs: Any,
    ) -> None:
        super().__init__(policy, clock, rng, lockouts, pacer, new_idempotency_key)
        self.client = client if client is not None else httpx.AsyncClient(**client_kwargs)
        self._install_hook(self.client, self._adrop_keys_cross_origin)
        self.on_conflict = on_conflict

    async def _adrop_keys_cross_origin(self, request: httpx.Request) -> None:
        self._drop_keys_cross_origin(request)

    async def request(
        self,
        method: str,
        url: Union[httpx.URL, str],
        *,
        deadline: Optional[float] = None,
        idempotency_key: "str | bool | None" = None,
        on_conflict: Optional[AsyncConflictHook] = None,
        cost: float = 1.0,
        **kwargs: Any,
    ) -> httpx.Response:
        """As :meth:`RetryingClient.request`."""
        request = self.client.build_request(method, url, **kwargs)
        hook = on_conflict or self.on_conflict
        call, timeouts = self._begin(request, deadline, idempotency_key, hook, cost)
        clock = self.engine.clock
        while True:
            await clock.asleep(call.before_attempt())
            _bound_timeouts(request, timeouts, call)
            resp = await self.client.send(request)
            await resp.aread()
            step = call.after_response(_view(resp, lambda: resp.content), resp)
            if step.action == "done":
                return resp
            if step.action == "conflict" and hook is not None:
                result = hook(resp)
                return await result if inspect.isawaitable(result) else result
            await resp.aclose()
            await clock.asleep(step.wait)

    async def get(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("GET", url, ...)``."""
        return await self.request("GET", url, **kwargs)

    async def head(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("HEAD", url, ...)``."""
        return await self.request("HEAD", url, **kwargs)

    async def post(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("POST", url, ...)``."""
        return await self.request("POST", url, **kwargs)

    async def put(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("PUT", url, ...)``."""
        return await self.request("PUT", url, **kwargs)

    async def patch(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("PATCH", url, ...)``."""
        return await self.request("PATCH", url, **kwargs)

    async def delete(self, url: Union[httpx.URL, str], **kwargs: Any) -> httpx.Response:
        """``request("DELETE", url, ...)``."""
        return await self.request("DELETE", url, **kwargs)

    async def aclose(self) -> None:
        """Closes the underlying client."""
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncRetryingClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
