"""rl_client: HTTP clients for APIs behind the rl gateway.

Full-jitter exponential backoff with ``Retry-After`` as a hard floor,
penalty-box lockouts, the token endpoint's retry limit, retries only for
idempotent requests or requests with an ``Idempotency-Key``, a 409 hook,
deadlines, and the ``RateLimit`` / ``RateLimit-Policy`` fields with a pacer.

The httpx clients live in ``rl_client.httpx_client`` and the requests
session in ``rl_client.requests_session`` (each needs its library); both
are also importable from here when the library is installed.
"""

from .clock import Clock, Random, SystemClock
from .engine import (
    IDEMPOTENT_METHODS,
    Call,
    LockoutRegistry,
    ResponseView,
    RetryEngine,
    RetryPolicy,
    Step,
    origin_of,
)
from .errors import (
    ATTEMPTS_EXHAUSTED,
    DEADLINE,
    LOCKOUT,
    NOT_RETRYABLE,
    RETRY_AFTER_TOO_LONG,
    LockoutError,
    RateLimitError,
)
from .headers import QuotaPolicy, RateLimitInfo, RateLimitItem, retry_after_seconds
from .pacing import Pacer

__all__ = [
    "ATTEMPTS_EXHAUSTED", "DEADLINE", "LOCKOUT", "NOT_RETRYABLE", "RETRY_AFTER_TOO_LONG",
    "IDEMPOTENT_METHODS",
    "Call", "Clock", "LockoutError", "LockoutRegistry", "Pacer", "QuotaPolicy", "Random",
    "RateLimitError", "RateLimitInfo", "RateLimitItem", "ResponseView", "RetryEngine",
    "RetryPolicy", "Step", "SystemClock", "origin_of", "retry_after_seconds",
]

try:
    from .httpx_client import AsyncRetryingClient, RetryingClient  # noqa: F401

    __all__ += ["AsyncRetryingClient", "RetryingClient"]
except ImportError:  # httpx not installed
    pass

try:
    from .requests_session import RetryingSession  # noqa: F401

    __all__ += ["RetryingSession"]
except ImportError:  # requests not installed
    pass
