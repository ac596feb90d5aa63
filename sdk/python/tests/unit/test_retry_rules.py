"""The client SDK rules, one or more tests each, on every adapter (httpx
sync, httpx async, requests), with a fake clock and a scripted random
source: nothing here sleeps for real."""

from __future__ import annotations

import random

import pytest

from rl_client import (
    ATTEMPTS_EXHAUSTED,
    DEADLINE,
    LOCKOUT,
    NOT_RETRYABLE,
    LockoutError,
    LockoutRegistry,
    RateLimitError,
    RetryPolicy,
)

from .fakes import ADAPTERS, Driver, FakeClock, Reply, ScriptedRandom, status_of, throttled

OK = Reply(200, {}, {"ok": True})


@pytest.fixture(params=ADAPTERS)
def adapter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# 1. full-jitter exponential backoff ------------------------------------------------


def test_backoff_is_full_jitter_exponential_with_the_default_parameters(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after=None)], rng=ScriptedRandom(1.0))
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.reason == ATTEMPTS_EXHAUSTED
    assert len(d.server.sent) == 5  # max_attempts 5: 4 retries
    # uniform(0, min(30, 0.5 * 2^n)) then uniform(0, 10% of the wait)
    assert d.rng.calls == [(0.0, 0.5), (0.0, 0.05), (0.0, 1.0), (0.0, 0.1),
                           (0.0, 2.0), (0.0, 0.2), (0.0, 4.0), (0.0, 0.4)]
    assert d.clock.sleeps == pytest.approx([0.55, 1.1, 2.2, 4.4])


def test_backoff_is_capped(adapter: str) -> None:
    policy = RetryPolicy(base=10, cap=30, max_attempts=5)
    d = Driver(adapter, [throttled(retry_after=None)], rng=ScriptedRandom(1.0), policy=policy)
    d.call("GET", "/v1/ledgers")
    assert [b for (_, b) in d.rng.calls[::2]] == [10, 20, 30, 30]


def test_backoff_draws_from_zero(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after=None), OK], rng=ScriptedRandom(0.0))
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert d.clock.sleeps == []  # uniform(0, ...) drew 0: no wait at all


# 2. Retry-After as a hard floor: delta-seconds and HTTP-date vs Date -----------------


def test_retry_after_delta_seconds_is_the_floor(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="7"), OK], rng=ScriptedRandom(0.0))
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert d.clock.sleeps == [7.0]


def test_retry_after_http_date_is_relative_to_the_date_header(adapter: str) -> None:
    # the local clock is years away: only Date matters
    clock = FakeClock(wall=946_684_800.0)  # 2000-01-01
    reply = throttled(retry_after="Tue, 01 Dec 2026 08:00:12 GMT",
                      Date="Tue, 01 Dec 2026 08:00:00 GMT")
    d = Driver(adapter, [reply, OK], rng=ScriptedRandom(0.0), clock=clock)
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert d.clock.sleeps == [12.0]


def test_retry_after_http_date_without_date_falls_back_to_the_wall_clock(adapter: str) -> None:
    clock = FakeClock(wall=1_796_112_000.0)  # 2026-12-01 08:00:00 UTC
    reply = throttled(retry_after="Tue, 01 Dec 2026 08:00:05 GMT")
    d = Driver(adapter, [reply, OK], rng=ScriptedRandom(0.0), clock=clock)
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert d.clock.sleeps == [5.0]


def test_unreadable_retry_after_leaves_the_backoff(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="soon"), OK], rng=ScriptedRandom(1.0))
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert d.clock.sleeps == pytest.approx([0.55])


# 3. wait max(Retry-After, backoff) plus 0-10 % of it ------------------------------


def test_wait_is_the_larger_of_retry_after_and_backoff_plus_up_to_ten_percent(
        adapter: str) -> None:
    policy = RetryPolicy(base=4)
    d = Driver(adapter, [throttled(retry_after="2"), throttled(retry_after="2"), OK],
               rng=ScriptedRandom(1.0), policy=policy)
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    # retry 0: backoff 4 > 2 -> 4 + 0.4; retry 1: backoff 8 -> 8 + 0.8
    assert d.clock.sleeps == pytest.approx([4.4, 8.8])
    d2 = Driver(adapter, [throttled(retry_after="9"), OK], rng=ScriptedRandom(0.5))
    d2.call("GET", "/v1/ledgers")
    # backoff 0.25 < 9: 9 plus half of 10 % of 9
    assert d2.clock.sleeps == pytest.approx([9.45])


# 4. never sooner than Retry-After ---------------------------------------------------


class _SeededRandom:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def uniform(self, a: float, b: float) -> float:
        return self.r.uniform(a, b)


@pytest.mark.parametrize("seed", range(20))
def test_never_sooner_than_retry_after(seed: int) -> None:
    ras = ["1", "3", "0", "12", "2"]
    replies = [throttled(retry_after=ra) for ra in ras[:4]] + [OK]
    d = Driver("httpx", replies, rng=_SeededRandom(seed))  # type: ignore[arg-type]
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert len(d.clock.sleeps) == 4
    for wait, ra in zip(d.clock.sleeps, ras):
        assert wait >= float(ra)
        # and never more than the larger of the two bounds, plus 10 %
        assert wait <= max(float(ra), 30.0) * 1.1


# 5. Active-Lockout: no retries for that key until Retry-After has passed ------------


def test_active_lockout_reaches_the_caller_at_once_and_locks_the_key(adapter: str) -> None:
    boxed = throttled(retry_after="30", request_id="req-boxed",
                      X_Penalty_Box_Status="Active-Lockout")
    d = Driver(adapter, [boxed, OK])
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, LockoutError) and err.reason == LOCKOUT
    assert err.request_id == "req-boxed" and err.retry_after == 30 and err.attempts == 1
    assert len(d.server.sent) == 1 and d.clock.sleeps == []
    # the same key: refused before anything is sent, with the time left
    d.clock.advance(10)
    again = d.call("GET", "/v1/ledgers/7")
    assert isinstance(again, LockoutError) and again.attempts == 0
    assert again.retry_after == pytest.approx(20) and again.request_id == "req-boxed"
    assert len(d.server.sent) == 1
    # another key is not locked
    ok = d.call("GET", "/v1/ledgers", headers={"X-Api-Key": "key-b"})
    assert status_of(ok) == 200 and len(d.server.sent) == 2
    # once Retry-After has passed, the key sends again
    d.clock.advance(20)
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert len(d.server.sent) == 3


def test_lockout_without_retry_after_is_not_retried_nor_remembered(adapter: str) -> None:
    manual = Reply(403, {"X-Penalty-Box-Status": "Active-Lockout"},
                   {"status": 403, "request_id": "req-manual"})
    d = Driver(adapter, [manual, OK])
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, LockoutError) and err.status == 403 and err.retry_after is None
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert len(d.server.sent) == 2


def test_a_shared_lockout_registry_spans_clients() -> None:
    clock = FakeClock()
    shared = LockoutRegistry(clock)
    boxed = throttled(retry_after="5", X_Penalty_Box_Status="Active-Lockout")
    a = Driver("httpx", [boxed], clock=clock, lockouts=shared)
    b = Driver("requests", [OK], clock=clock, lockouts=shared)
    assert isinstance(a.call("GET", "/v1/ledgers"), LockoutError)
    assert isinstance(b.call("GET", "/v1/ledgers"), LockoutError)
    assert b.server.sent == []


def test_a_retry_waiting_meets_a_lockout_taken_meanwhile() -> None:
    clock = FakeClock()
    d = Driver("httpx", [throttled(retry_after="2"), OK], clock=clock)
    shared = d.engine.lockouts
    original_sleep = clock.sleep

    def sleep_and_get_boxed(seconds: float) -> None:
        original_sleep(seconds)
        # another call on the same key was boxed while this one waited
        shared.lock(("http://api.test:80", "key-a"), 60, LockoutError(
            LOCKOUT, status=429, request_id="other", retry_after=60, problem=None,
            rate_limit=None, attempts=1))
    clock.sleep = sleep_and_get_boxed  # type: ignore[method-assign]
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, LockoutError) and err.request_id == "other"
    assert len(d.server.sent) == 1


# 6. 429 on the token endpoint: at most 2 retries, same credential -------------------


def test_token_endpoint_is_retried_at_most_twice_with_the_same_credential(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="1", request_id="req-tok")],
               headers={"Authorization": "Basic YWxpY2U6cmlnaHQ="})
    err = d.call("POST", "/v1/auth/token", data={"grant_type": "client_credentials"})
    assert isinstance(err, RateLimitError) and err.reason == ATTEMPTS_EXHAUSTED
    assert err.request_id == "req-tok" and err.attempts == 3
    assert len(d.server.sent) == 3
    assert {s.headers["authorization"] for s in d.server.sent} == {"Basic YWxpY2U6cmlnaHQ="}
    assert len({s.body for s in d.server.sent}) == 1


# 7. retries only for idempotent requests or with an Idempotency-Key -----------------


def test_post_without_idempotency_key_is_not_retried(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="1", request_id="req-post"), OK])
    err = d.call("POST", "/v1/ledgers/1/entries", json={"amount": 5})
    assert isinstance(err, RateLimitError) and err.reason == NOT_RETRYABLE
    assert err.request_id == "req-post" and len(d.server.sent) == 1
    assert "idempotency-key" not in d.server.sent[0].headers


@pytest.mark.parametrize("how", ["generated", "explicit", "policy", "header"])
def test_post_with_idempotency_key_is_retried_with_the_same_key(adapter: str, how: str) -> None:
    options = {"policy": RetryPolicy(auto_idempotency_key=True)} if how == "policy" else {}
    d = Driver(adapter, [throttled(), throttled(), OK],
               new_idempotency_key=lambda: "generated-key", **options)
    kw = {"generated": {"idempotency_key": True}, "explicit": {"idempotency_key": "my-key"},
          "policy": {}, "header": {"headers": {"Idempotency-Key": "my-key"}}}[how]
    resp = d.call("POST", "/v1/ledgers/reconcile", json={"ledger_id": "L1"}, **kw)
    assert status_of(resp) == 200 and len(d.server.sent) == 3
    expected = "my-key" if how in ("explicit", "header") else "generated-key"
    assert [s.headers["idempotency-key"] for s in d.server.sent] == [expected] * 3
    assert len({s.body for s in d.server.sent}) == 1


def test_generated_keys_differ_per_call(adapter: str) -> None:
    d = Driver(adapter, [OK], policy=RetryPolicy(auto_idempotency_key=True))
    d.call("POST", "/v1/ledgers/reconcile")
    d.call("POST", "/v1/ledgers/reconcile")
    d.call("GET", "/v1/ledgers")  # idempotent: no key
    keys = [s.headers.get("idempotency-key") for s in d.server.sent]
    assert keys[0] and keys[1] and keys[0] != keys[1] and keys[2] is None


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"])
def test_idempotent_methods_are_retried(adapter: str, method: str) -> None:
    d = Driver(adapter, [throttled(), OK])
    assert status_of(d.call(method, "/v1/ledgers/1")) == 200
    assert len(d.server.sent) == 2


def test_the_gateways_fail_closed_503_is_retried_after_its_retry_after(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="15", status=503), OK], rng=ScriptedRandom(0.0))
    assert status_of(d.call("GET", "/v1/reports/audit-export")) == 200
    assert d.clock.sleeps == [15.0]


def test_other_errors_are_returned_untouched(adapter: str) -> None:
    d = Driver(adapter, [Reply(500, {"Retry-After": "1"}, "boom"), OK])
    assert status_of(d.call("GET", "/v1/ledgers")) == 500 and len(d.server.sent) == 1


# 8. a 409 conflict goes to the caller's hook, never resubmitted ---------------------


def test_conflict_calls_the_hook_instead_of_resubmitting(adapter: str) -> None:
    conflict = Reply(409, {"Retry-After": "3"},
                     {"type": "https://api.example.com/problems/concurrency-limit-exceeded",
                      "status": 409, "request_id": "req-409"})
    seen = []

    def poll_existing_job(resp: object) -> str:
        seen.append(status_of(resp))
        return "job-status"

    d = Driver(adapter, [conflict, OK])
    got = d.call("POST", "/v1/ledgers/reconcile", idempotency_key="k1",
                 on_conflict=poll_existing_job)
    assert got == "job-status" and seen == [409] and len(d.server.sent) == 1
    assert d.clock.sleeps == []
    # without a hook the 409 is returned as it is, still not resubmitted
    d2 = Driver(adapter, [conflict, OK])
    assert status_of(d2.call("POST", "/v1/ledgers/reconcile", idempotency_key="k1")) == 409
    assert len(d2.server.sent) == 1


def test_async_conflict_hook_may_be_a_coroutine() -> None:
    conflict = Reply(409, {}, {"status": 409})

    async def poll(resp: object) -> str:
        return "polled"

    d = Driver("httpx-async", [conflict], on_conflict=poll)
    assert d.call("POST", "/v1/ledgers/reconcile", idempotency_key="k") == "polled"


# 9. no retry after the last attempt, nor past the deadline ---------------------------


def test_last_attempt_fails_with_the_last_429_and_its_request_id(adapter: str) -> None:
    replies = [throttled(request_id=f"req-{i}") for i in range(1, 4)]
    d = Driver(adapter, replies, policy=RetryPolicy(max_attempts=3))
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.reason == ATTEMPTS_EXHAUSTED
    assert err.request_id == "req-3" and err.status == 429 and err.attempts == 3
    assert len(d.server.sent) == 3 and len(d.clock.sleeps) == 2
    assert err.problem is not None and err.problem["request_id"] == "req-3"
    assert status_of(err.response) == 429


def test_a_wait_past_the_deadline_fails_at_once(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="1", request_id="req-a"),
                         throttled(retry_after="10", request_id="req-b"), OK],
               rng=ScriptedRandom(0.0))
    err = d.call("GET", "/v1/ledgers", deadline=5.0)
    assert isinstance(err, RateLimitError) and err.reason == DEADLINE
    assert err.request_id == "req-b" and err.retry_after == 10
    assert len(d.server.sent) == 2 and d.clock.sleeps == [1.0]  # never slept the 10 s


def test_the_policy_deadline_applies_when_the_call_gives_none(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="4"), OK], rng=ScriptedRandom(0.0),
               policy=RetryPolicy(deadline=3.0))
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.reason == DEADLINE
    assert len(d.server.sent) == 1 and d.clock.sleeps == []


def test_request_id_falls_back_to_the_x_request_id_header(adapter: str) -> None:
    d = Driver(adapter, [Reply(429, {"X-Request-Id": "hdr-id"}, "plain text")],
               policy=RetryPolicy(max_attempts=1))
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.request_id == "hdr-id"
    assert err.problem is None


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base=-1)
