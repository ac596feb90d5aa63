"""The response fields and problem bodies of a refusal, as rl's gateway
writes them: ``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-
ratelimit-headers), ``Retry-After`` and application/problem+json bodies
(RFC 9457). One definition, checked against the shared test vectors in
``sdk/responses.json``."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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

#: a request id echoed in problem bodies: ASCII letters, digits, ``_.:-``, 1 to 64
SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

#: body members copied from the refusal when given, after the common ones
_OPTIONAL = ("block_type", "upgrade_url", "challenge", "concurrency_limit", "degraded")


def request_id(given: Optional[str]) -> str:
    """``given`` (the request's X-Request-Id) when it is safe to echo, else
    32 random hex digits (as the Node SDK)."""
    return given if given is not None and SAFE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


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


class _Absent:
    """A body member left out (``None`` is written as JSON null)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


def problem(problem_base: str, status: int, kind: str, detail: Optional[str],
            instance: Optional[str] = None, request_id: Optional[str] = None,
            retry_after_s: Optional[int] = ABSENT, tier: Optional[str] = None,
            policy: Optional[str] = ABSENT, strikes: Optional[int] = None,
            boxed: bool = False, level: Optional[int] = None, lockout_ends_at: Optional[str] = None,
            **extra: Any) -> Dict[str, Any]:
    """A refusal's problem body, as the gateway renders it: on 429, 403, 409
    and 503 the wait (null when there is none), the backoff, the tier (null
    when unknown) and the policy; ``ABSENT`` members are left out."""
    body: Dict[str, Any] = {"type": f"{problem_base}/{kind}", "title": TITLES.get(kind, kind),
                            "status": status, "detail": detail, "instance": instance,
                            "request_id": request_id}
    if status in (429, 403, 409, 503) or (status == 401 and kind == "challenge-required"):
        body["retry_after_seconds"] = retry_after_s
        body["recommended_backoff"] = "none" if retry_after_s in (None, ABSENT) else RECOMMENDED_BACKOFF
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
    return {k: v for k, v in body.items() if v is not ABSENT}


@dataclass(frozen=True)
class Conf:
    """The options the answers depend on (the gateway's defaults)."""

    problem_base: str = "https://api.example.com/problems"
    legacy_headers: bool = False
    #: a box configured to last this long or more gets an HTTP-date Retry-After
    http_date_after: float = 3600
    manual_box_status: int = 403
    fail_closed_retry_after: int = 15


@dataclass(frozen=True)
class Answer:
    """A refusal (or, status 200, the fields of an admitted request)."""

    status: int
    headers: Dict[str, str]
    body: Optional[Dict[str, Any]] = None


@dataclass(frozen=True)
class Limiter:
    """What a refusal says of the rule that refused (a bucket, window or quota)."""

    name: str
    #: "bucket", "window" or "quota"
    kind: str
    unit: str
    #: the w of the binding policy (period, window, or period of the quota, seconds)
    window: Optional[float]
    cost: int
    #: box durations of levels 1..3 (the server's 300 3600 86400 when None)
    box: Optional[Tuple[float, float, float]] = None
    strikes_threshold: Optional[int] = None
    #: the refusal's status: 429 (403 for a quota)
    status: Optional[int] = None
    upgrade_url: Optional[str] = None


def admitted(conf: Conf, policies: Sequence[Policy], binding: Optional[Binding]) -> Answer:
    """The fields of an admitted request: every policy, and the binding one's RateLimit."""
    fields: Dict[str, str] = {}
    if policies:
        fields["RateLimit-Policy"] = policy_field(policies)
    if binding is not None:
        fields.update(ratelimit_fields(binding, conf.legacy_headers))
    return Answer(200, fields)


def limiter_refusal(conf: Conf, policies: Sequence[Policy], rule: Limiter, binding: Binding,
                    box_level: int, retry_after_ms: int, strikes_remaining: Optional[int],
                    path: str, request_id: str, tier: Optional[str],
                    now: Optional[float] = None) -> Answer:
    """A refusal by a bucket, window or quota (or its penalty box: ``binding.boxed``);
    ``retry_after_ms`` negative: no time to come back (a manual box, or a cost that never fits)."""
    fields = admitted(conf, policies, binding).headers
    retry_ms = None if retry_after_ms < 0 else retry_after_ms
    secs = None if retry_ms is None else seconds(retry_ms)
    status = rule.status or (403 if rule.kind == "quota" else 429)
    kind = "quota-exceeded" if rule.kind == "quota" else "rate-limit-exceeded"
    if binding.boxed:
        kind = "penalty-box-active"
        status = 429 if retry_ms is not None else conf.manual_box_status
        fields["X-Penalty-Box-Status"] = "Active-Lockout"
        box = rule.box or (300, 3600, 86400)
        length = box[box_level - 1] if 1 <= box_level <= 3 else 0
        value = retry_after(retry_ms, as_date=length >= conf.http_date_after, now=now)
        detail = boxed_detail(binding.name, box_level, secs)
    else:
        if strikes_remaining is not None and rule.strikes_threshold \
                and strikes_remaining < rule.strikes_threshold:
            fields["X-Penalty-Box-Status"] = "Warning"
        value = retry_after(retry_ms)
        detail = rate_detail(binding.name, binding.limit, rule.unit, binding.window, rule.cost,
                             secs)
    if value is not None:
        fields["Retry-After"] = value
    body = problem(conf.problem_base, status, kind, detail, instance=path, request_id=request_id,
                   retry_after_s=secs, tier=tier, policy=binding.name, strikes=strikes_remaining,
                   boxed=binding.boxed, level=box_level or None,
                   lockout_ends_at=timestamp(ends_at(retry_ms, now))
                   if binding.boxed and retry_ms is not None else None,
                   upgrade_url=rule.upgrade_url)
    return Answer(status, fields, body)


def lease_retry_ms(ttl: float, expected: float, earliest_left_ms: int) -> int:
    """The Retry-After (ms) of a full lease: the earliest holder's expected end
    (``expected`` seconds after it started: it started ``ttl - earliest_left``
    ago), at least 1 s, at most the earliest expiry; never the ttl itself."""
    elapsed = ttl * 1000 - earliest_left_ms
    retry = max(expected * 1000 - elapsed, 1000)
    return int(math.ceil(min(retry, max(earliest_left_ms, 1000))))


def lease_refusal(conf: Conf, policies: Sequence[Policy], name: str, max_leases: int, ttl: float,
                  expected: float, status: int, earliest_left_ms: int, path: str,
                  request_id: str, tier: Optional[str]) -> Answer:
    """A full concurrency lease (429) or a lock held by another request (409)."""
    fields = admitted(conf, policies, Binding(name, max_leases, 0, None)).headers
    secs = seconds(lease_retry_ms(ttl, expected, earliest_left_ms))
    fields["Retry-After"] = str(secs)
    return Answer(status, fields, problem(
        conf.problem_base, status, "concurrency-limit-exceeded", lease_detail(name, max_leases, secs),
        instance=path, request_id=request_id, retry_after_s=secs, tier=tier, policy=name,
        concurrency_limit=max_leases))


def fail_closed(conf: Conf, path: str, request_id: str, tier: Optional[str]) -> Answer:
    """Redis failed on a route that fails closed: 503."""
    wait = conf.fail_closed_retry_after
    return Answer(503, {"Retry-After": str(wait)}, problem(
        conf.problem_base, 503, "rate-limiter-unavailable", fail_closed_detail(wait),
        instance=path, request_id=request_id, tier=tier))


def idempotency_required(conf: Conf, path: str, request_id: str) -> Answer:
    """A route that requires an Idempotency-Key, a request without one: 400."""
    return Answer(400, {}, problem(
        conf.problem_base, 400, "idempotency-key-required",
        "This route requires an Idempotency-Key header (a unique value per operation).",
        instance=path, request_id=request_id))


def encode(body: Mapping[str, Any]) -> bytes:
    """The JSON bytes of a problem body."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def header_list(fields: Mapping[str, str]) -> List[tuple[bytes, bytes]]:
    """ASGI headers from a field mapping."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in fields.items()]
