"""Errors the SDK raises when it gives a throttled request back to the caller."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .headers import RateLimitInfo

#: Why the SDK stopped retrying.
NOT_RETRYABLE = "not_retryable"  # not idempotent and no Idempotency-Key
ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # max_attempts (or the token endpoint's 2 retries) used
DEADLINE = "deadline"  # the next wait would pass the caller's deadline
LOCKOUT = "lockout"  # X-Penalty-Box-Status: Active-Lockout
#: Retry-After (or the pacer's delay) above RetryPolicy.max_retry_after, or not finite
RETRY_AFTER_TOO_LONG = "retry_after_too_long"


class RateLimitError(Exception):
    """A throttled answer (429, or another status of ``RetryPolicy.retry_statuses``
    such as the gateway's fail-closed 503) that the SDK did not retry, or no
    longer retries.

    Also raised before a request is sent when the pacer's delay would pass
    the deadline (``DEADLINE``) or exceed ``RetryPolicy.max_retry_after``
    (``RETRY_AFTER_TOO_LONG``); ``status`` is then None.

    Attributes: ``status``; ``request_id`` (the problem body's ``request_id``,
    else the ``X-Request-Id`` header); ``retry_after`` (seconds, or None);
    ``problem`` (the ``application/problem+json`` body, or None);
    ``rate_limit`` (the parsed ``RateLimit`` fields); ``attempts`` (requests
    sent for this call); ``reason`` (one of the module's reason constants);
    ``response`` (the library's response object of the last attempt; its
    body has been read).
    """

    def __init__(
        self,
        reason: str,
        *,
        status: Optional[int],
        request_id: Optional[str],
        retry_after: Optional[float],
        problem: Optional[Mapping[str, Any]],
        rate_limit: Optional[RateLimitInfo],
        attempts: int,
        response: Any = None,
    ) -> None:
        self.reason = reason
        self.status = status
        self.request_id = request_id
        self.retry_after = retry_after
        self.problem = problem
        self.rate_limit = rate_limit
        self.attempts = attempts
        self.response = response
        wait = f", retry after {retry_after:g} s" if retry_after is not None else ""
        super().__init__(
            f"{reason}: HTTP {status} after {attempts} attempt(s){wait} (request_id {request_id})"
        )


class LockoutError(RateLimitError):
    """The API key is in the penalty box (``X-Penalty-Box-Status:
    Active-Lockout``). Raised on the boxed answer itself, and then before
    any request with the same key is sent until its ``Retry-After`` has
    passed (those carry ``attempts == 0`` and the boxed answer's details;
    ``retry_after`` is then the time left)."""
