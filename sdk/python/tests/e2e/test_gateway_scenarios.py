"""The SDK against the real gateway (nginx + the Lua library) and Redis with
the rl module. The policy (``sdk/e2e/policy.lua``): 5-point buckets that
refill at 1 point a second, 20 strikes in 60 s box a key, level-1 boxes of
4 s (delta-seconds Retry-After) or 6 s (HTTP-date)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import httpx
import pytest
import requests

import launcher
from rl_client import (
    LOCKOUT,
    NOT_RETRYABLE,
    AsyncRetryingClient,
    LockoutError,
    LockoutRegistry,
    Pacer,
    RateLimitError,
    RetryingClient,
    RetryingSession,
    RetryPolicy,
)

pytestmark = pytest.mark.e2e

THRESHOLD = 20  # strikes that trip the box (policy.lua)
BURST, RATE = 5, 1.0  # points, points per second (policy.lua)
HONOUR_SECONDS = 60.0
PACED_SECONDS = 15.0


def box_status(gw: launcher.Gateway, name: str) -> List[int]:
    """``RL.BOX STATUS`` of scenario ``name``'s key: [level, ttl_ms, offenses, strikes]."""
    reply = gw.redis("RL.BOX", "STATUS", f"rl:{{t:t-{name}}}:key:{name}")
    assert isinstance(reply, list)
    return [int(x) for x in reply]


def upstream_count(gw: launcher.Gateway, key: str) -> Any:
    """What the upstream saw of an Idempotency-Key: {received, processed}."""
    return httpx.get(f"{gw.upstream_url}/_count", params={"key": key}, timeout=10).json()


@dataclass
class Seen:
    """One response as the wire saw it (event hooks), with the time it came."""

    at: float
    status: int
    retry_after: Optional[str]
    box_status: Optional[str]
    strikes_remaining: Optional[int]


@dataclass
class Recorder:
    """httpx event hooks recording every request's send time and response."""

    sent_at: List[float] = field(default_factory=list)
    seen: List[Seen] = field(default_factory=list)

    def on_request(self, request: httpx.Request) -> None:
        self.sent_at.append(time.monotonic())

    def on_response(self, resp: httpx.Response) -> None:
        resp.read()
        self._record(resp)

    async def aon_request(self, request: httpx.Request) -> None:
        self.on_request(request)

    async def aon_response(self, resp: httpx.Response) -> None:
        await resp.aread()
        self._record(resp)

    def _record(self, resp: httpx.Response) -> None:
        strikes = None
        if "json" in resp.headers.get("content-type", ""):
            strikes = json.loads(resp.content).get("penalty_strikes_remaining")
        self.seen.append(Seen(time.monotonic(), resp.status_code, resp.headers.get("retry-after"),
                              resp.headers.get("x-penalty-box-status"), strikes))

    def hooks(self) -> Any:
        return {"request": [self.on_request], "response": [self.on_response]}

    def async_hooks(self) -> Any:
        return {"request": [self.aon_request], "response": [self.aon_response]}

    def throttled(self) -> List[Seen]:
        return [s for s in self.seen if s.status == 429]


def client_for(gw: launcher.Gateway, name: str, rec: Recorder, **options: Any) -> RetryingClient:
    return RetryingClient(base_url=gw.url, headers={"X-Api-Key": f"k-{name}"},
                          event_hooks=rec.hooks(), timeout=20, **options)


def exhaust(gw: launcher.Gateway, name: str) -> None:
    """Empties scenario ``name``'s bucket (a few refusals, far from the box)."""
    with httpx.Client(base_url=gw.url, headers={"X-Api-Key": f"k-{name}"}, timeout=20) as c:
        for _ in range(BURST + 1):
            c.get("/v1/ledgers")


def drain(gw: launcher.Gateway, name: str, limit: int = 60) -> List[int]:
    """Sends GETs with scenario ``name``'s key, no retries, no waits, until
    the key is boxed (bounded); returns the statuses."""
    statuses = []
    with httpx.Client(base_url=gw.url, headers={"X-Api-Key": f"k-{name}"}, timeout=20) as c:
        for _ in range(limit):
            r = c.get("/v1/ledgers")
            statuses.append(r.status_code)
            if r.headers.get("x-penalty-box-status") == "Active-Lockout":
                return statuses
    raise AssertionError(f"{name}: not boxed after {limit} requests: {statuses}")


# --- a client that honours the waits for 60 s of full use -----------------------------


def test_a_client_honouring_the_waits_for_60_s_of_full_use_is_never_struck_nor_boxed(
        gateway: launcher.Gateway) -> None:
    """A refusal is a strike only when it arrives before the retry time the
    previous refusal announced: a client that waits as told is never
    struck, however often it is refused."""
    rec = Recorder()
    client = client_for(gateway, "honour", rec)
    allowed, gave_up = 0, None
    start = time.monotonic()
    for _ in range(10_000):  # bounded; the clock ends the loop
        if time.monotonic() - start >= HONOUR_SECONDS:
            break
        try:
            assert client.get("/v1/ledgers").status_code == 200
            allowed += 1
        except RateLimitError as e:
            gave_up = e
            break
    elapsed = time.monotonic() - start
    client.close()
    # every retry came after its Retry-After
    for i, s in enumerate(rec.seen[:-1]):
        if s.status == 429 and s.retry_after is not None:
            assert rec.sent_at[i + 1] - s.at >= float(s.retry_after), (i, s)
    throttled = rec.throttled()
    assert len(throttled) >= 10, "the client never ran into the limit: nothing was tested"
    assert gave_up is None, f"the SDK gave up: {gave_up!r}"
    assert [s for s in rec.seen if s.box_status == "Active-Lockout"] == []
    assert {s.strikes_remaining for s in throttled} == {THRESHOLD}, "strikes were counted"
    assert box_status(gateway, "honour") == [0, 0, 0, 0]
    # full use: at least half of what the bucket could give in the time
    assert allowed >= 0.5 * (BURST + elapsed * RATE), (allowed, elapsed)


def test_a_paced_client_never_meets_a_429(gateway: launcher.Gateway) -> None:
    rec = Recorder()
    client = client_for(gateway, "paced", rec, pacer=Pacer())
    start, allowed = time.monotonic(), 0
    for _ in range(10_000):
        if time.monotonic() - start >= PACED_SECONDS:
            break
        assert client.get("/v1/ledgers").status_code == 200
        allowed += 1
    elapsed = time.monotonic() - start
    client.close()
    assert rec.throttled() == [] and all(s.box_status is None for s in rec.seen)
    assert client.rate_limit is not None and client.rate_limit.binding is not None
    assert client.rate_limit.binding.name == "steady-key"
    assert allowed >= 0.5 * (BURST + elapsed * RATE), (allowed, elapsed)
    assert box_status(gateway, "paced") == [0, 0, 0, 0]


# --- a client with retries off and no waits -------------------------------------------


def test_a_client_without_retries_or_waits_is_warned_then_boxed(
        gateway: launcher.Gateway) -> None:
    rec = Recorder()
    client = client_for(gateway, "rude", rec, policy=RetryPolicy(max_attempts=1))
    errors: List[RateLimitError] = []
    for _ in range(60):
        try:
            client.get("/v1/ledgers")
        except LockoutError as e:
            errors.append(e)
            break
        except RateLimitError as e:
            errors.append(e)
    client.close()
    assert isinstance(errors[-1], LockoutError), [e.reason for e in errors]
    warned = [s for s in rec.seen if s.box_status == "Warning"]
    assert len(warned) >= THRESHOLD - 1
    assert min(s.strikes_remaining or 0 for s in warned) <= 1  # counted down to the box
    assert all(len(e.request_id or "") == 32 for e in errors)
    assert len(rec.sent_at) == len(rec.seen)  # one request per call: no retry
    level, ttl_ms, offenses, _ = box_status(gateway, "rude")
    assert level == 1 and offenses == 1 and 0 < ttl_ms <= 4000


# --- Active-Lockout stops retries -----------------------------------------------------


@pytest.mark.parametrize("name", ["lock", "lock-async", "lock-requests"])
def test_active_lockout_stops_retries_until_retry_after(gateway: launcher.Gateway,
                                                        name: str) -> None:
    drain(gateway, name)
    rec = Recorder()

    def call() -> Any:
        if name == "lock-async":
            async def go() -> Any:
                async with AsyncRetryingClient(base_url=gateway.url, timeout=20,
                                               headers={"X-Api-Key": f"k-{name}"},
                                               event_hooks=rec.async_hooks(),
                                               lockouts=lockouts) as c:
                    return await c.get("/v1/ledgers")
            return asyncio.run(go())
        if name == "lock-requests":
            with RetryingSession(lockouts=lockouts) as s:
                s.headers["X-Api-Key"] = f"k-{name}"
                s.hooks["response"].append(lambda r, *a, **kw: rec.sent_at.append(0.0))
                return s.get(gateway.url + "/v1/ledgers", timeout=20)
        with client_for(gateway, name, rec, lockouts=lockouts) as c:
            return c.get("/v1/ledgers")

    lockouts = LockoutRegistry()  # shared by the clients below, as one app would
    t0 = time.monotonic()
    with pytest.raises(LockoutError) as boxed:
        call()
    assert time.monotonic() - t0 < 2.0  # at once: no wait, no retry
    err = boxed.value
    assert err.reason == LOCKOUT and err.attempts == 1 and err.status == 429
    assert err.retry_after is not None and 0 < err.retry_after <= 4
    assert err.problem is not None and err.problem["penalty_level"] == 1
    assert len(err.request_id or "") == 32
    sent = len(rec.sent_at)
    assert sent == 1
    # the key is locked in the SDK: nothing is sent until Retry-After has passed
    with pytest.raises(LockoutError) as again:
        call()
    assert again.value.attempts == 0 and len(rec.sent_at) == sent
    time.sleep(err.retry_after + 0.2)
    assert int(getattr(call(), "status_code")) == 200


def test_an_http_date_retry_after_is_read_against_the_date_header(
        gateway: launcher.Gateway) -> None:
    drain(gateway, "dated")
    rec = Recorder()
    with client_for(gateway, "dated", rec) as c:
        with pytest.raises(LockoutError) as boxed:
            c.get("/v1/ledgers")
        err = boxed.value
        raw, date = err.response.headers["retry-after"], err.response.headers["date"]
        assert not raw.isdigit(), raw  # the 6 s box is announced as an HTTP-date
        # the wait is the HTTP-date minus the response's Date, at most the box's 6 s
        # (both whole seconds: up to one more)
        expected = (email.utils.parsedate_to_datetime(raw)
                    - email.utils.parsedate_to_datetime(date)).total_seconds()
        assert err.retry_after == expected and 0 < expected <= 7, (raw, date)
        time.sleep(err.retry_after + 0.2)
        assert c.get("/v1/ledgers").status_code == 200


# --- a retried POST with an Idempotency-Key lands once ---------------------------------


@pytest.mark.parametrize("name", ["idem", "idem-async", "idem-requests"])
def test_a_retried_post_with_an_idempotency_key_lands_once(gateway: launcher.Gateway,
                                                           name: str) -> None:
    keys = iter(f"{name}-key-{i}" for i in range(20))
    statuses: List[int] = []  # what the wire answered, attempt by attempt

    def post(path: str, **kw: Any) -> Any:
        statuses.clear()
        headers = {"X-Api-Key": f"k-{name}"}
        if name == "idem-async":
            async def record(r: httpx.Response) -> None:
                statuses.append(r.status_code)

            async def go() -> Any:
                async with AsyncRetryingClient(base_url=gateway.url, headers=headers,
                                               timeout=20, event_hooks={"response": [record]},
                                               new_idempotency_key=lambda: next(keys)) as c:
                    return await c.post(path, **kw)
            return asyncio.run(go())
        if name == "idem-requests":
            with RetryingSession(new_idempotency_key=lambda: next(keys)) as s:
                s.headers.update(headers)
                s.hooks["response"].append(lambda r, *a, **k: statuses.append(r.status_code))
                return s.post(gateway.url + path, timeout=20, **kw)
        with RetryingClient(base_url=gateway.url, headers=headers, timeout=20,
                            event_hooks={"response": [lambda r: statuses.append(r.status_code)]},
                            new_idempotency_key=lambda: next(keys)) as c:
            return c.post(path, **kw)

    # the upstream does the work but its answer is lost (503): the retry replays
    r = post("/v1/ledgers/L1/entries?fail_first=1", json={"amount": 5}, idempotency_key=True)
    assert r.status_code == 200 and r.json()["replayed"] is True and statuses == [503, 200]
    assert upstream_count(gateway, f"{name}-key-0") == {"received": 2, "processed": 1}
    # the gateway refuses it (429): the retry after Retry-After is the one that lands. A
    # point may refill between emptying the bucket and the POST: then it lands at once
    # (which is no retry), and the scenario is tried again (bounded)
    for i in range(1, 6):
        exhaust(gateway, name)
        r = post("/v1/ledgers/L1/entries", json={"amount": 6}, idempotency_key=True)
        assert r.status_code == 200 and r.json()["replayed"] is False
        assert upstream_count(gateway, f"{name}-key-{i}") == {"received": 1, "processed": 1}
        if statuses[0] == 429:
            break
    assert statuses == [429, 200], statuses
    # without a key a POST is not retried: the 429 comes back at once (same bound)
    refused = None
    for _ in range(5):
        exhaust(gateway, name)
        try:
            post("/v1/ledgers/L1/entries", json={"amount": 7})
        except RateLimitError as e:
            refused = e
            break
    assert refused is not None and statuses == [429]
    assert refused.reason == NOT_RETRYABLE and refused.attempts == 1
    assert len(refused.request_id or "") == 32


# --- a 409 polls the existing job -------------------------------------------------------


def test_a_409_conflict_polls_the_existing_job(gateway: launcher.Gateway) -> None:
    headers = {"X-Api-Key": "k-conflict"}
    # the first reconcile holds its lease 8 s: the second comes while it runs even on a
    # loaded machine (it is sent once the first reached the API, polled for below)
    holder = threading.Thread(target=lambda: httpx.post(
        f"{gateway.url}/v1/ledgers/reconcile?ledger_id=L9&hold=8",
        headers={**headers, "Idempotency-Key": "first-run"}, timeout=20))
    holder.start()
    try:
        deadline = time.monotonic() + 10
        while upstream_count(gateway, "first-run")["received"] == 0:
            assert time.monotonic() < deadline, "the first reconcile never reached the API"
            time.sleep(0.05)
        rec = Recorder()
        polled: List[int] = []

        def poll_existing_job(conflict: httpx.Response) -> httpx.Response:
            polled.append(conflict.status_code)
            return httpx.get(f"{gateway.url}/v1/ledgers/L9", headers=headers, timeout=20)

        with client_for(gateway, "conflict", rec, on_conflict=poll_existing_job) as c:
            r = c.post("/v1/ledgers/reconcile", params={"ledger_id": "L9"},
                       idempotency_key="second-run")
        assert polled == [409] and r.status_code == 200 and r.json()["uri"] == "/v1/ledgers/L9"
        assert [s.status for s in rec.seen] == [409]  # submitted once, never again
        assert upstream_count(gateway, "second-run")["received"] == 0
    finally:
        holder.join(timeout=20)
