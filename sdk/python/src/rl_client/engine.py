"""The retry decisions, independent of the HTTP library (sans I/O).

A :class:`RetryEngine` holds the policy, the clock, the randomness, the
lockout registry and the last rate-limit state; each request is a
:class:`Call` that the library adapters (``rl_client.httpx_client``,
``rl_client.requests_session``) drive: ``before_attempt()`` before each
send, ``after_response()`` after it, which says: done, hand the 409 to the
conflict hook, or wait this long and send again; or raises.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import (Any, Callable, Dict, FrozenSet, Mapping, MutableMapping, Optional, Tuple,
                    TypeVar)

from . import errors
from .clock import Clock, Random, SystemClock, system_random
from .errors import LockoutError, RateLimitError
from .headers import HeaderGetter, RateLimitInfo, retry_after_seconds
from .pacing import Pacer

#: RFC 9110's idempotent methods.
IDEMPOTENT_METHODS: FrozenSet[str] = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long the SDK waits before sending a request again.

    - ``base``, ``cap`` (seconds), ``max_attempts`` (requests in all, the
      first included): the full-jitter backoff of retry number ``n``
      (0 for the first retry) is ``uniform(0, min(cap, base * 2**n))``.
    - ``jitter_ratio``: the wait, ``max(Retry-After, backoff)``, is stretched
      by ``uniform(0, jitter_ratio)`` of itself (so never below Retry-After).
    - ``retry_statuses``: the statuses retried (429 and the gateway's
      fail-closed 503).
    - ``token_paths`` and ``token_max_retries``: requests to these paths (the
      token endpoint) are retried at most that many times, with the same
      credentials; they count as retryable without an Idempotency-Key.
    - ``idempotent_methods``: retried as they are; other methods only with an
      ``Idempotency-Key`` header (``idempotency_header``).
    - ``auto_idempotency_key``: give every non-idempotent request without
      one a generated key (also per request: ``idempotency_key=True``).
    - ``deadline``: default time budget of a call in seconds (None: none).
    - ``lockout_key_headers``: the request headers whose first present
      value identifies the API key for penalty-box lockouts. A lockout is
      recorded only for a request with such a key, keyed by (origin of the
      request URL, key), and only when the answer came from that origin (not
      after a redirect to another one). The clients also drop these headers
      when a redirect leaves the request's origin.
    - ``max_retry_after``: the longest single wait (seconds) the SDK accepts
      from ``Retry-After`` or the pacer; a longer (or infinite) one raises
      :class:`RateLimitError` with reason ``retry_after_too_long`` instead.
    - ``max_lockout``: the longest a lockout is remembered (seconds), whatever
      the boxed answer's ``Retry-After``.
    """

    base: float = 0.5
    cap: float = 30.0
    max_attempts: int = 5
    jitter_ratio: float = 0.1
    retry_statuses: FrozenSet[int] = frozenset({429, 503})
    token_paths: Tuple[str, ...] = ("/v1/auth/token",)
    token_max_retries: int = 2
    idempotent_methods: FrozenSet[str] = IDEMPOTENT_METHODS
    idempotency_header: str = "Idempotency-Key"
    auto_idempotency_key: bool = False
    deadline: Optional[float] = None
    lockout_key_headers: Tuple[str, ...] = ("X-Api-Key", "Authorization")
    max_retry_after: float = 300.0
    max_lockout: float = 86400.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base < 0 or self.cap < 0 or self.jitter_ratio < 0 or self.token_max_retries < 0:
            raise ValueError("base, cap, jitter_ratio and token_max_retries must be >= 0")
        if not (self.max_retry_after >= 0 and self.max_lockout >= 0):  # NaN fails too
            raise ValueError("max_retry_after and max_lockout must be >= 0")

    def replace(self, **changes: Any) -> "RetryPolicy":
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class _Lockout:
    until: float
    error: LockoutError


#: A lockout's key: (origin of the request URL, API key).
LockoutKey = Tuple[str, str]


def origin_of(url: str) -> str:
    """``scheme://host:port`` of a URL (lower case, default port filled in),
    "" when it has no host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ""
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not host:
        return ""
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}:{port}" if port is not None else f"{scheme}://{host}"


class LockoutRegistry:
    """API keys in the penalty box, by (origin, key), until when (monotonic
    clock). Share one between clients that use the same keys; thread-safe."""

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self._clock = clock or SystemClock()
        self._locked: Dict[LockoutKey, _Lockout] = {}
        self._mutex = threading.Lock()

    def lock(self, key: LockoutKey, seconds: float, error: LockoutError) -> None:
        """Locks ``key`` for ``seconds`` from now (a longer lock already held stays)."""
        until = self._clock.monotonic() + seconds
        with self._mutex:
            held = self._locked.get(key)
            if held is None or held.until < until:
                self._locked[key] = _Lockout(until, error)

    def remaining(self, key: LockoutKey) -> Optional[Tuple[float, LockoutError]]:
        """(seconds left, the boxed answer's error) while ``key`` is locked, else None."""
        now = self._clock.monotonic()
        with self._mutex:
            held = self._locked.get(key)
            if held is None:
                return None
            if held.until <= now:
                del self._locked[key]
                return None
            return held.until - now, held.error


#: Problem bodies larger than this (bytes) are not parsed.
MAX_PROBLEM_BYTES = 64 * 1024


class ResponseView:
    """What the engine reads of a response: status, headers, problem body,
    and the origin of the URL that answered (``url``; None: the request's)."""

    def __init__(self, status: int, get_header: HeaderGetter, body: Callable[[], bytes],
                 url: Optional[str] = None) -> None:
        self.status = status
        self.header = get_header
        self._body = body
        self.origin = origin_of(url) if url is not None else None

    def problem(self) -> Optional[Mapping[str, Any]]:
        """The JSON body (problem+json or JSON) as a dict, or None: also when
        it is larger than ``MAX_PROBLEM_BYTES`` (by ``Content-Length`` or
        bytes read) or fails to parse in any way (e.g. too deeply nested)."""
        ctype = (self.header("Content-Type") or "").lower()
        if "json" not in ctype:
            return None
        length = (self.header("Content-Length") or "").strip()
        if length.isascii() and length.isdigit() and (
                len(length) > 18 or int(length) > MAX_PROBLEM_BYTES):
            return None
        try:
            body = self._body()
            if len(body) > MAX_PROBLEM_BYTES:
                return None
            parsed = json.loads(body)
        except Exception:  # any parse failure (RecursionError included) means no body
            return None
        return parsed if isinstance(parsed, dict) else None


@dataclass(frozen=True)
class Step:
    """What to do after a response: ``"done"`` (return it), ``"conflict"``
    (hand it to the conflict hook) or ``"wait"`` (sleep ``wait`` seconds,
    then send again)."""

    action: str
    wait: float = 0.0


DONE = Step("done")
CONFLICT = Step("conflict")


class RetryEngine:
    """Shared state of one client: policy, clock, randomness, lockouts,
    pacer and the last ``RateLimit`` state seen (``rate_limit``)."""

    def __init__(
        self,
        policy: Optional[RetryPolicy] = None,
        *,
        clock: Optional[Clock] = None,
        rng: Optional[Random] = None,
        lockouts: Optional[LockoutRegistry] = None,
        pacer: Optional[Pacer] = None,
        new_idempotency_key: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.clock: Clock = clock or SystemClock()
        self.rng: Random = rng or system_random()
        self.lockouts = lockouts or LockoutRegistry(self.clock)
        self.pacer = pacer
        self.new_idempotency_key = new_idempotency_key
        #: The ``RateLimit`` fields of the latest response that had them.
        self.rate_limit: Optional[RateLimitInfo] = None

    def begin(
        self,
        method: str,
        path: str,
        headers: MutableMapping[str, str],
        *,
        deadline: Optional[float] = None,
        idempotency_key: "str | bool | None" = None,
        has_conflict_hook: bool = False,
        cost: float = 1.0,
        origin: str = "",
    ) -> "Call":
        """Starts a call; sets the Idempotency-Key in ``headers`` (a
        case-insensitive mapping) when asked for or generated. ``origin``:
        the request URL's (see :func:`origin_of`), half of its lockout key."""
        return Call(self, method.upper(), path, headers, deadline, idempotency_key,
                    has_conflict_hook, cost, origin)

    def observe(self, info: Optional[RateLimitInfo]) -> None:
        """Records a response's ``RateLimit`` fields (and tells the pacer)."""
        if info is None:
            return
        self.rate_limit = info
        if self.pacer is not None:
            self.pacer.observe(info)


class Call:
    """One request through the engine, over all its attempts."""

    def __init__(
        self,
        engine: RetryEngine,
        method: str,
        path: str,
        headers: MutableMapping[str, str],
        deadline: Optional[float],
        idempotency_key: "str | bool | None",
        has_conflict_hook: bool,
        cost: float,
        origin: str = "",
    ) -> None:
        policy = engine.policy
        self.engine = engine
        self.attempts = 0
        self.cost = cost
        self.has_conflict_hook = has_conflict_hook
        budget = deadline if deadline is not None else policy.deadline
        self.deadline_at = None if budget is None else engine.clock.monotonic() + budget
        self.origin = origin
        key = next((headers[h] for h in policy.lockout_key_headers if headers.get(h)), "")
        #: (origin, API key), or None for a request without a key (never locked).
        self.lockout_key: Optional[LockoutKey] = (origin, key) if key else None
        mutating = method not in policy.idempotent_methods
        if isinstance(idempotency_key, str):
            headers[policy.idempotency_header] = idempotency_key
        elif (idempotency_key is True or (idempotency_key is None and policy.auto_idempotency_key)) \
                and mutating and not headers.get(policy.idempotency_header):
            headers[policy.idempotency_header] = engine.new_idempotency_key()
        self.is_token = path in policy.token_paths
        self.retryable = (not mutating) or self.is_token or bool(
            headers.get(policy.idempotency_header))
        max_retries = policy.max_attempts - 1
        if self.is_token:
            max_retries = min(max_retries, policy.token_max_retries)
        self.max_retries = max_retries

    def remaining(self) -> Optional[float]:
        """Seconds left before the deadline (>= 0), None without one."""
        if self.deadline_at is None:
            return None
        return max(0.0, self.deadline_at - self.engine.clock.monotonic())

    def attempt_timeout(self) -> Optional[float]:
        """The timeout for the next attempt: the seconds left before the
        deadline (None without one). Raises :class:`RateLimitError`
        (``DEADLINE``, status None) when none is left."""
        left = self.remaining()
        if left is not None and left <= 0:
            raise RateLimitError(errors.DEADLINE, status=None, request_id=None, retry_after=None,
                                 problem=None, rate_limit=self.engine.rate_limit,
                                 attempts=self.attempts)
        return left

    def before_attempt(self) -> float:
        """Raises :class:`LockoutError` while the key is in the penalty box;
        else returns the seconds to wait first (the pacer's advice, 0 without
        a pacer). Raises :class:`RateLimitError` (status None) when that wait
        would pass the deadline (``DEADLINE``) or is above the policy's
        ``max_retry_after`` (``RETRY_AFTER_TOO_LONG``)."""
        held = self.engine.lockouts.remaining(self.lockout_key) if self.lockout_key else None
        if held is not None:
            left, boxed = held
            raise LockoutError(
                errors.LOCKOUT, status=boxed.status, request_id=boxed.request_id,
                retry_after=left, problem=boxed.problem, rate_limit=boxed.rate_limit,
                attempts=0, response=boxed.response)
        pacer = self.engine.pacer
        delay = pacer.delay(self.cost) if pacer is not None else 0.0
        if delay <= 0:
            return 0.0

        def refuse(reason: str) -> RateLimitError:
            return RateLimitError(reason, status=None, request_id=None, retry_after=delay,
                                  problem=None, rate_limit=self.engine.rate_limit,
                                  attempts=self.attempts)

        if not math.isfinite(delay) or delay > self.engine.policy.max_retry_after:
            raise refuse(errors.RETRY_AFTER_TOO_LONG)
        time_left = self.remaining()
        if time_left is not None and delay > time_left:
            raise refuse(errors.DEADLINE)
        return delay

    def after_response(self, resp: ResponseView, raw: Any = None) -> Step:
        """Decides what follows a response (``raw`` is the library's own
        response object, kept on errors). Raises :class:`RateLimitError` (or
        :class:`LockoutError`) when a throttled answer goes back to the caller."""
        engine, policy = self.engine, self.engine.policy
        self.attempts += 1
        info = RateLimitInfo.from_headers(resp.header)
        engine.observe(info)
        boxed = (resp.header("X-Penalty-Box-Status") or "").strip().lower() == "active-lockout"
        if resp.status < 400 or (resp.status not in policy.retry_statuses and not boxed):
            if resp.status == 409 and self.has_conflict_hook:
                return CONFLICT
            return DONE
        retry_after = retry_after_seconds(resp.header, engine.clock.wall)

        def fail(reason: str, kind: type = RateLimitError) -> RateLimitError:
            problem = resp.problem()
            request_id = problem.get("request_id") if problem else None
            if not isinstance(request_id, str):
                request_id = resp.header("X-Request-Id")
            err: RateLimitError = kind(
                reason, status=resp.status, request_id=request_id, retry_after=retry_after,
                problem=problem, rate_limit=info, attempts=self.attempts, response=raw)
            return err

        if boxed:
            err = fail(errors.LOCKOUT, LockoutError)
            assert isinstance(err, LockoutError)
            same_origin = resp.origin is None or resp.origin == self.origin
            if retry_after is not None and self.lockout_key is not None and same_origin:
                engine.lockouts.lock(self.lockout_key, min(retry_after, policy.max_lockout), err)
            raise err
        if not self.retryable:
            raise fail(errors.NOT_RETRYABLE)
        retry = self.attempts - 1
        if retry >= self.max_retries:
            raise fail(errors.ATTEMPTS_EXHAUSTED)
        if retry_after is not None and not (retry_after <= policy.max_retry_after):
            raise fail(errors.RETRY_AFTER_TOO_LONG)
        backoff = engine.rng.uniform(0.0, min(policy.cap, policy.base * (2.0 ** min(retry, 64))))
        wait = max(retry_after or 0.0, backoff)
        wait += engine.rng.uniform(0.0, policy.jitter_ratio * wait)
        if self.deadline_at is not None and engine.clock.monotonic() + wait > self.deadline_at:
            raise fail(errors.DEADLINE)
        return Step("wait", wait)


R = TypeVar("R")


def run_sync(call: Call, send: Callable[[], R], view: Callable[[R], ResponseView],
             close: Callable[[R], None], hook: Optional[Callable[[R], R]]) -> R:
    """The blocking attempt loop of the sync adapters: pace, send, decide,
    then return, hand a 409 to ``hook``, or close the answer and wait.
    Bounded by the policy's ``max_attempts`` (``after_response`` raises)."""
    clock = call.engine.clock
    while True:
        clock.sleep(call.before_attempt())
        resp = send()
        step = call.after_response(view(resp), resp)
        if step.action == "done":
            return resp
        if step.action == "conflict" and hook is not None:
            return hook(resp)
        close(resp)
        clock.sleep(step.wait)
