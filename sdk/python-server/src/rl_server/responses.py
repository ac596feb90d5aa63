"""The response fields and problem bodies of a refusal, as rl's gateway
writes them: ``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-
ratelimit-headers), ``Retry-After`` and application/problem+json bodies
(RFC 9457). One definition, checked against the shared test vectors in
``sdk/responses.json``."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Dict, List, Mapping, Optional, Sequence

CONTENT_TYPE = "application/problem+json"
#: the backoff refusals recommend (``none`` when there is no time to come back)
RECOMMENDED_BACKOFF = "exponential_with_full_jitter"
#: the field (and body member) of an answer decided without Redis
DEGRADED = "X-RateLimit-Degraded"
DEGRADED_VALUE = "fallback"

TITLES = {
    "rate-limit-exceeded": "Rate limit exceeded",
    "penalty-box-active": "Penalty box active",
    "concurrency-limit-exceeded": "Concurrency limit exceeded",
    "rate-limiter-unavailable": "Rate limiter unavailable",
    "unauthenticated": "Unknown or missing API key",
    "ambiguous-argument": "Ambiguous request argument",
    "quota-exceeded": "Quota exceeded",
    "challenge-required": "Re-authentication required",
    "idempotency-key-required": "Idempotency-Key required",
}

#: body members copied from the refusal when given, after the common ones
_OPTIONAL = ("block_type", "upgrade_url", "challenge", "concurrency_limit", "degraded")


def seconds(ms: Optional[int]) -> int:
    """Whole seconds from milliseconds, rounded up (clients are never early); 0 for none."""
    if ms is None or ms <= 0:
        return 0
    return -(-ms // 1000)


def number(v: float) -> str:
    """A number as the gateway prints it (Lua's ``%.14g``: 60, 0.5, 86400)."""
    return "%.14g" % v


def sf_string(s: str) -> str:
    """A structured-field String item."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Policy:
    """One quota policy: ``quota`` units per ``window`` seconds (None: a concurrency limit)."""

    name: str
    quota: int
    window: Optional[float] = None
    unit: str = "requests"

    def item(self) -> str:
        """``"name";q=quota[;qu="unit"][;w=window]``."""
        s = f"{sf_string(self.name)};q={self.quota}"
        if self.unit != "requests":
            s += f";qu={sf_string(self.unit)}"
        if self.window is not None:
            s += f";w={number(self.window)}"
        return s


def policy_field(policies: Sequence[Policy]) -> str:
    """The RateLimit-Policy value: every policy that applies."""
    return ", ".join(p.item() for p in policies)


@dataclass(frozen=True)
class Binding:
    """The policy a decision describes (the one that refused, or the tightest)."""

    name: str
    limit: int
    remaining: int
    #: ms until full again (None or negative: no time, as in a manual box)
    reset_ms: Optional[int]
    window: Optional[float] = None
    #: a window or quota: ``t`` is at most the window (a bucket's may be longer)
    clamp: bool = False
    boxed: bool = False


def ratelimit_fields(b: Binding, legacy: bool = False) -> Dict[str, str]:
    """The RateLimit field (and with ``legacy`` the RateLimit-Limit/-Remaining/-Reset
    triple) of the binding policy: ``r`` units left, ``t`` seconds until back."""
    t: Optional[int] = None
    if not b.boxed and b.reset_ms is not None and b.reset_ms >= 0:
        t = seconds(b.reset_ms)
        if b.clamp and b.window is not None:
            t = min(t, math.ceil(b.window))
    r = max(b.remaining, 0)
    out = {"RateLimit": f"{sf_string(b.name)};r={r}" + (f";t={t}" if t is not None else "")}
    if legacy:
        out["RateLimit-Limit"] = str(b.limit)
        out["RateLimit-Remaining"] = str(r)
        if t is not None:
            out["RateLimit-Reset"] = str(t)
    return out


def ends_at(ms: int, now: Optional[float] = None) -> int:
    """The Unix time (whole seconds, rounded up) ``ms`` from ``now``."""
    now_ms = (time.time() if now is None else now) * 1000
    return math.ceil((now_ms + ms) / 1000)


def retry_after(ms: Optional[int], as_date: bool = False, now: Optional[float] = None) -> Optional[str]:
    """Retry-After: delta-seconds, or an HTTP-date with ``as_date``; None for no wait (a manual box)."""
    if ms is None or ms < 0:
        return None
    if as_date:
        return formatdate(ends_at(ms, now), usegmt=True)
    return str(seconds(ms))


def timestamp(t: float) -> str:
    """The RFC 3339 UTC form of a Unix time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.floor(t)))


def rate_detail(name: str, limit: int, unit: str, window: Optional[float], cost: int,
                retry_s: Optional[int]) -> str:
    """The ``detail`` of a refused rate, window or quota."""
    return (f"{name}: {limit} {unit} per {number(window) if window is not None else 'nil'} s exhausted "
            f"(this request: {cost}); " + (f"retry in {retry_s} s." if retry_s is not None else "it never fits."))


def boxed_detail(name: str, level: int, retry_s: Optional[int]) -> str:
    """The ``detail`` of a penalty box."""
    return (f"{name}: locked (level {level}) after repeated refusals; "
            + (f"retry in {retry_s} s." if retry_s is not None else "until a manual review."))


def lease_detail(name: str, max_leases: int, retry_s: Optional[int]) -> str:
    """The ``detail`` of a full concurrency lease or lock."""
    return f"{name}: at most {max_leases} concurrent request(s); retry in {retry_s or 1} s."


def fail_closed_detail(wait_s: int) -> str:
    """The ``detail`` of a 503 when Redis fails on a route that fails closed."""
    return f"The rate limiter is unavailable and this route fails closed; retry in {wait_s} s."


def problem(problem_base: str, status: int, kind: str, detail: Optional[str],
            instance: Optional[str] = None, request_id: Optional[str] = None,
            retry_after_s: Optional[int] = None, tier: Optional[str] = None,
            policy: Optional[str] = None, strikes: Optional[int] = None,
            boxed: bool = False, level: Optional[int] = None, lockout_ends_at: Optional[str] = None,
            **extra: Any) -> Dict[str, Any]:
    """A refusal's problem body (members left out when they have no value),
    as the gateway's rule engine renders it."""
    body: Dict[str, Any] = {"type": f"{problem_base}/{kind}", "title": TITLES.get(kind, kind),
                            "status": status, "detail": detail, "instance": instance,
                            "request_id": request_id}
    if status in (429, 403, 409, 503) or (status == 401 and kind == "challenge-required"):
        body["retry_after_seconds"] = retry_after_s
        body["recommended_backoff"] = "none" if retry_after_s is None else RECOMMENDED_BACKOFF
        body["quota_tier"] = tier
        body["policy"] = policy
    if strikes is not None:
        body["penalty_strikes_remaining"] = strikes
    if boxed:
        body["penalty_level"] = level
        body["lockout_ends_at"] = lockout_ends_at
    for k in _OPTIONAL:
        if extra.get(k) is not None:
            body[k] = extra[k]
    return {k: v for k, v in body.items() if v is not None}


def encode(body: Mapping[str, Any]) -> bytes:
    """The JSON bytes of a problem body."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def header_list(fields: Mapping[str, str]) -> List[tuple[bytes, bytes]]:
    """ASGI headers from a field mapping."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in fields.items()]
