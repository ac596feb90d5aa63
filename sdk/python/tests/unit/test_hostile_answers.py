"""Answers a hostile or broken server may send: a ``Retry-After`` or
pacing fields that ask for days, lockouts without a key, from another
origin or of any length, problem bodies that are huge or nested too deep.
Fake clock and scripted transports: nothing sleeps."""

from __future__ import annotations

import math

import pytest

from rl_client import (
    DEADLINE,
    LOCKOUT,
    RETRY_AFTER_TOO_LONG,
    LockoutError,
    Pacer,
    RateLimitError,
    ResponseView,
    RetryPolicy,
)

from .fakes import ADAPTERS, Driver, FakeClock, Reply, status_of, throttled

OK = Reply(200, {}, "ok")


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("value,expected", [
    ("86400", 86400.0), ("301", 301.0), ("99999999999", 99999999999.0), ("9" * 400, math.inf),
])
def test_a_retry_after_above_the_limit_is_refused_not_waited(
        adapter: str, value: str, expected: float) -> None:
    d = Driver(adapter, [throttled(retry_after=value), OK])
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.reason == RETRY_AFTER_TOO_LONG
    assert err.retry_after == expected and err.status == 429 and err.attempts == 1
    assert d.clock.sleeps == [] and len(d.server.sent) == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_retry_after_at_the_limit_is_waited(adapter: str) -> None:
    d = Driver(adapter, [throttled(retry_after="300"), OK])
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert len(d.clock.sleeps) == 1 and d.clock.sleeps[0] >= 300


def test_the_limit_is_a_policy_option() -> None:
    d = Driver("httpx", [throttled(retry_after="11"), OK],
               policy=RetryPolicy(max_retry_after=10))
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.reason == RETRY_AFTER_TOO_LONG
    d = Driver("httpx", [throttled(retry_after="86400"), OK],
               policy=RetryPolicy(max_retry_after=86400))
    assert status_of(d.call("GET", "/v1/ledgers")) == 200


def test_new_policy_fields_are_validated() -> None:
    assert RetryPolicy().max_retry_after == 300 and RetryPolicy().max_lockout == 86400
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError):
            RetryPolicy(max_retry_after=bad)
        with pytest.raises(ValueError):
            RetryPolicy(max_lockout=bad)


def _pacing(window: str) -> Reply:
    return Reply(200, {"RateLimit-Policy": f'"a";q=1;w={window}', "RateLimit": '"a";r=0'}, "ok")


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_pacers_delay_is_checked_against_the_deadline(adapter: str) -> None:
    clock = FakeClock()
    d = Driver(adapter, [_pacing("86400")], clock=clock, pacer=Pacer(clock=clock),
               policy=RetryPolicy(max_retry_after=10**9))
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    err = d.call("GET", "/v1/ledgers", deadline=2)
    assert isinstance(err, RateLimitError) and err.reason == DEADLINE and err.status is None
    assert clock.sleeps == [] and len(d.server.sent) == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("window", ["86400", "999999999999"])
def test_the_pacers_delay_is_capped_like_retry_after(adapter: str, window: str) -> None:
    clock = FakeClock()
    d = Driver(adapter, [_pacing(window)], clock=clock, pacer=Pacer(clock=clock))
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.reason == RETRY_AFTER_TOO_LONG
    assert err.retry_after is not None and err.retry_after > 300
    assert clock.sleeps == [] and len(d.server.sent) == 1


def _boxed(retry_after: str) -> Reply:
    return throttled(retry_after=retry_after, X_Penalty_Box_Status="Active-Lockout")


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_lockout_without_an_api_key_is_not_remembered(adapter: str) -> None:
    d = Driver(adapter, [_boxed("60"), OK], headers={})
    assert isinstance(d.call("GET", "/v1/ledgers"), LockoutError)
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
    assert len(d.server.sent) == 2


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("value", ["31536000", "9" * 400])
def test_a_lockout_lasts_at_most_max_lockout(adapter: str, value: str) -> None:
    d = Driver(adapter, [_boxed(value), OK])
    err = d.call("GET", "/v1/ledgers")
    assert isinstance(err, LockoutError) and err.reason == LOCKOUT
    d.clock.advance(86399)
    held = d.call("GET", "/v1/ledgers")
    assert isinstance(held, LockoutError) and held.retry_after == pytest.approx(1)
    d.clock.advance(1)
    assert status_of(d.call("GET", "/v1/ledgers")) == 200


def test_a_lockout_is_per_origin() -> None:
    d = Driver("httpx", [_boxed("60"), OK])
    assert isinstance(d.call("GET", "/v1/ledgers"), LockoutError)
    assert isinstance(d.call("GET", "http://API.test:80/v1/ledgers"), LockoutError)
    assert status_of(d.call("GET", "http://other.test/v1/ledgers")) == 200


def test_a_lockout_from_another_origin_is_not_remembered() -> None:
    d = Driver("httpx", [OK])
    call = d.engine.begin("GET", "/v1", {"X-Api-Key": "k"}, origin="http://api.test:80")
    assert call.before_attempt() == 0.0
    headers = {"x-penalty-box-status": "Active-Lockout", "retry-after": "60"}
    foreign = ResponseView(429, lambda n: headers.get(n.lower()), lambda: b"",
                           "http://evil.test/steal")
    with pytest.raises(LockoutError):
        call.after_response(foreign)
    assert d.engine.lockouts.remaining(("http://api.test:80", "k")) is None
    own = ResponseView(429, lambda n: headers.get(n.lower()), lambda: b"",
                       "http://api.test/v1")
    with pytest.raises(LockoutError):
        call.after_response(own)
    assert d.engine.lockouts.remaining(("http://api.test:80", "k")) is not None


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_deeply_nested_problem_body_is_no_problem(adapter: str) -> None:
    deep = Reply(429, {"Content-Type": "application/problem+json", "X-Request-Id": "r-1"},
                 "[" * 200000)
    err = Driver(adapter, [deep]).call("POST", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.problem is None and err.request_id == "r-1"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_problem_body_above_64_kib_is_not_parsed(adapter: str) -> None:
    big = '{"request_id": "from-body", "pad": "' + "x" * (64 * 1024) + '"}'
    reply = Reply(429, {"Content-Type": "application/problem+json", "X-Request-Id": "r-2"}, big)
    err = Driver(adapter, [reply]).call("POST", "/v1/ledgers")
    assert isinstance(err, RateLimitError) and err.problem is None
    assert err.request_id == "r-2"


def test_a_content_length_above_64_kib_skips_the_read() -> None:
    def never() -> bytes:
        raise AssertionError("read")
    h = {"content-type": "application/json", "content-length": "65537"}
    assert ResponseView(429, lambda n: h.get(n.lower()), never).problem() is None
    h["content-length"] = "9" * 30
    assert ResponseView(429, lambda n: h.get(n.lower()), never).problem() is None
    h["content-length"] = "2"
    assert ResponseView(429, lambda n: h.get(n.lower()), lambda: b"{}").problem() == {}
