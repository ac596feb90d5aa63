"""A :class:`requests.Session` that retries by the rl rules."""

from __future__ import annotations

from typing import Any, Callable, Optional
from urllib.parse import urlsplit

import requests
from requests.structures import CaseInsensitiveDict

from .clock import Clock, Random
from .engine import LockoutRegistry, ResponseView, RetryEngine, RetryPolicy, run_sync
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
                                 has_conflict_hook=hook is not None, cost=cost)
        kwargs["headers"] = dict(merged)
        send = super().request
        return run_sync(call, lambda: send(method, url, **kwargs),
                        lambda r: ResponseView(r.status_code, r.headers.get, lambda: r.content),
                        requests.Response.close, hook)
