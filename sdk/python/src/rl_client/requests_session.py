"""A :class:`requests.Session` that retries by the rl rules."""

from __future__ import annotations

from typing import Any, Callable, Optional
from urllib.parse import urlsplit

import requests
from requests.structures import CaseInsensitiveDict

from .clock import Clock, Random
from .engine import (Call, LockoutRegistry, ResponseView, RetryEngine, RetryPolicy, origin_of,
                     run_sync)
from .headers import RateLimitInfo
from .pacing import Pacer

#: The caller's hook for a 409 (a concurrency conflict): polls the job that
#: holds the resource and returns the response to give back.
ConflictHook = Callable[[requests.Response], requests.Response]


class RetryingSession(requests.Session):
    """``requests.Session`` whose ``request`` (and so ``get``, ``post``, ...)
    retries throttled requests: each attempt sends the same method, URL,
    body and headers (``data``/``json`` are sent again; a generator body
    cannot be). Extra keyword arguments per request: ``deadline``,
    ``idempotency_key``, ``on_conflict``, ``cost`` (see
    :meth:`rl_client.RetryingClient.request`). Raises
    :class:`rl_client.RateLimitError` for a throttled answer it gives up on.

    A ``deadline`` also bounds each attempt: its ``timeout`` becomes at most
    the time left (requests then raises its own ``Timeout``). A redirect to
    another host drops the policy's ``lockout_key_headers`` (the API key),
    not only ``Authorization``.
    """

    def __init__(
        self,
        *,
        policy: Optional[RetryPolicy] = None,
        clock: Optional[Clock] = None,
        rng: Optional[Random] = None,
        lockouts: Optional[LockoutRegistry] = None,
        pacer: Optional[Pacer] = None,
        on_conflict: Optional[ConflictHook] = None,
        new_idempotency_key: Optional[Callable[[], str]] = None,
    ) -> None:
        super().__init__()
        extra = {"new_idempotency_key": new_idempotency_key} if new_idempotency_key else {}
        self.engine = RetryEngine(policy, clock=clock, rng=rng, lockouts=lockouts, pacer=pacer,
                                  **extra)
        self.on_conflict = on_conflict

    @property
    def rate_limit(self) -> Optional[RateLimitInfo]:
        """The ``RateLimit`` / ``RateLimit-Policy`` fields of the latest response."""
        return self.engine.rate_limit

    def request(  # type: ignore[override]
        self,
        method: str,
        url: str,
        *args: Any,
        deadline: Optional[float] = None,
        idempotency_key: "str | bool | None" = None,
        on_conflict: Optional[ConflictHook] = None,
        cost: float = 1.0,
        **kwargs: Any,
    ) -> requests.Response:
        """``requests.Session.request`` with the retry rules."""
        if args:
            raise TypeError("RetryingSession.request: pass everything after url by keyword")
        merged: CaseInsensitiveDict[str] = CaseInsensitiveDict(
            {k: v for k, v in self.headers.items() if isinstance(v, str)})
        merged.update(kwargs.get("headers") or {})
        hook = on_conflict or self.on_conflict
        call = self.engine.begin(method, urlsplit(url).path, merged, deadline=deadline,
                                 idempotency_key=idempotency_key,
                                 has_conflict_hook=hook is not None, cost=cost,
                                 origin=origin_of(url))
        kwargs["headers"] = dict(merged)
        send = super().request
        given = kwargs.pop("timeout", None)

        def attempt() -> requests.Response:
            return send(method, url, timeout=_bounded_timeout(given, call), **kwargs)

        return run_sync(call, attempt,
                        lambda r: ResponseView(r.status_code, r.headers.get, lambda: r.content,
                                               r.url),
                        requests.Response.close, hook)

    def rebuild_auth(self, prepared_request: requests.PreparedRequest,
                     response: requests.Response) -> None:
        """Also drops the policy's ``lockout_key_headers`` (e.g. ``X-Api-Key``)
        when a redirect goes where requests drops ``Authorization``."""
        old = response.request.url if response.request is not None else None
        if old and prepared_request.url and self.should_strip_auth(  # type: ignore[no-untyped-call]
                old, prepared_request.url):
            for name in self.engine.policy.lockout_key_headers:
                prepared_request.headers.pop(name, None)
        super().rebuild_auth(prepared_request, response)  # type: ignore[no-untyped-call]


def _bounded_timeout(given: Any, call: Call) -> Any:
    """requests' ``timeout`` (None, seconds or a (connect, read) pair) with
    each part at most the time left before the call's deadline."""
    left = call.attempt_timeout()
    if left is None:
        return given
    if isinstance(given, tuple):
        return tuple(left if part is None else min(part, left) for part in given)
    return left if given is None else min(given, left)
