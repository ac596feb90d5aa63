"""Rule 10: the RateLimit / RateLimit-Policy fields, parsed as structured
fields and exposed; the pacer that slows a batch before the bucket empties."""

from __future__ import annotations

from typing import Dict, Optional

import pytest

from rl_client import Pacer, RateLimitInfo, retry_after_seconds

from .fakes import ADAPTERS, Driver, FakeClock, Reply


def fields(**headers: str) -> Optional[RateLimitInfo]:
    h: Dict[str, str] = {k.replace("_", "-").lower(): v for k, v in headers.items()}
    return RateLimitInfo.from_headers(lambda name: h.get(name.lower()))


def test_gateway_fields_parse_into_policies_and_the_binding_item() -> None:
    info = fields(RateLimit_Policy='"growth-key";q=3000;w=60, "growth-tenant";q=6000;w=60',
                  RateLimit='"growth-key";r=2990;t=1')
    assert info is not None
    assert list(info.policies) == ["growth-key", "growth-tenant"]
    assert info.policies["growth-tenant"].quota == 6000
    assert info.policies["growth-key"].rate == pytest.approx(50.0)
    assert info.binding is not None and info.binding.name == "growth-key"
    assert info.remaining == 2990 and info.reset == 1
    assert info.policy_of(info.binding) == info.policies["growth-key"]


def test_structured_field_syntax_is_honoured() -> None:
    # escapes in strings, tokens as names, extra parameters, whitespace
    info = fields(RateLimit_Policy='"a\\"b";q=10;w=1;pk=:cHJvZg==:,   day;q=1000;w=86400',
                  RateLimit='day;r=5;t=3600;extra')
    assert info is not None
    assert list(info.policies) == ['a"b', "day"]
    assert info.binding is not None and info.binding.name == "day"
    assert info.binding.params["extra"] is True
    assert info.policy_of(info.binding) is not None


def test_a_manual_box_has_no_reset() -> None:
    info = fields(RateLimit='"enterprise-key";r=0')
    assert info is not None and info.remaining == 0 and info.reset is None


def test_the_older_drafts_forms_are_read() -> None:
    info = fields(RateLimit_Policy="3000;w=60", RateLimit_Remaining="2412",
                  RateLimit_Reset="18", RateLimit_Limit="3000")
    assert info is not None and info.remaining == 2412 and info.reset == 18
    assert info.binding is not None
    policy = info.policy_of(info.binding)
    assert policy is not None and policy.quota == 3000 and policy.window == 60


@pytest.mark.parametrize("bad", ['"unterminated', "a;q=1,,", "é;q=1", ";;", "(a b;q=1)"])
def test_malformed_fields_are_ignored_not_raised(bad: str) -> None:
    info = fields(RateLimit=bad, RateLimit_Policy=bad)
    assert info is None or (info.binding is None and not info.policies)


def test_no_fields_is_none() -> None:
    assert fields() is None


@pytest.mark.parametrize("value,expected", [
    ("0", 0.0), ("  12 ", 12.0), ("-3", None), ("1.5", None), ("", None), ("soon", None),
    ("Tue, 01 Dec 2026 08:01:00 GMT", 60.0),
    ("Tuesday, 01-Dec-26 08:01:00 GMT", 60.0),  # RFC 850
    ("Tue Dec  1 08:01:00 2026", 60.0),  # asctime: no zone, UTC all the same
    ("Tue, 01 Dec 2026 07:59:00 GMT", 0.0),  # in the past: no wait
])
def test_retry_after_forms(value: str, expected: Optional[float]) -> None:
    h = {"retry-after": value, "date": "Tue, 01 Dec 2026 08:00:00 GMT"}
    assert retry_after_seconds(lambda n: h.get(n.lower()), lambda: 0.0) == expected


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_client_exposes_the_latest_fields(adapter: str) -> None:
    ok = Reply(200, {"RateLimit-Policy": '"k";q=60;w=60', "RateLimit": '"k";r=41;t=19'}, "x")
    d = Driver(adapter, [ok, Reply(200, {}, "no fields")])
    d.call("GET", "/v1/ledgers")
    assert d.client.rate_limit is not None and d.client.rate_limit.remaining == 41
    d.call("GET", "/v1/ledgers")  # a response without fields keeps the last state
    assert d.client.rate_limit.remaining == 41


def _observed(pacer: Pacer, remaining: int, reset: Optional[int], quota: int = 60,
              window: int = 60) -> None:
    t = f";t={reset}" if reset is not None else ""
    pacer.observe(fields(RateLimit_Policy=f'"k";q={quota};w={window}',
                         RateLimit=f'"k";r={remaining}{t}'))


def test_pacer_goes_at_once_while_above_the_reserve() -> None:
    clock = FakeClock()
    pacer = Pacer(clock=clock)
    assert pacer.delay() == 0.0  # nothing seen yet
    _observed(pacer, remaining=20, reset=40)  # a bucket of 60: reserve 6
    assert pacer.delay() == 0.0
    _observed(pacer, remaining=7, reset=53)
    assert pacer.delay() == 0.0  # 7 - 1 still keeps 6


def test_pacer_waits_for_the_refill_below_the_reserve() -> None:
    clock = FakeClock()
    pacer = Pacer(clock=clock)
    _observed(pacer, remaining=3, reset=57)  # 1 point a second; wants 6 + 1: 4 short
    assert pacer.delay() == pytest.approx(4.0)
    assert pacer.delay(cost=10) == pytest.approx(13.0)
    clock.advance(1.5)  # time since the answer counts
    assert pacer.delay() == pytest.approx(2.5)
    clock.advance(10)
    assert pacer.delay() == 0.0
    pacer.wait()
    assert clock.sleeps == []


def test_pacer_sizes_the_reserve_by_the_bucket() -> None:
    clock = FakeClock()
    pacer = Pacer(clock=clock)
    _observed(pacer, remaining=3, reset=None)  # no t: the quota q (60) is the size
    assert pacer.delay() == pytest.approx(4.0)
    # a bucket of 5 (r + t * 1/s): the reserve is min_reserve, 1 point
    _observed(pacer, remaining=2, reset=3)
    assert pacer.delay() == 0.0
    _observed(pacer, remaining=1, reset=4)
    assert pacer.delay() == pytest.approx(1.0)


def test_pacer_reserve_options_and_unknown_rates() -> None:
    clock = FakeClock()
    pacer = Pacer(clock=clock, reserve_ratio=0.0, min_reserve=0.0)
    _observed(pacer, remaining=0, reset=30, quota=120, window=60)
    assert pacer.delay() == pytest.approx(0.5)  # 2 points a second
    pacer.observe(fields(RateLimit='"other";r=0;t=5'))  # no policy: no rate
    assert pacer.delay() == 0.0
    with pytest.raises(ValueError):
        Pacer(reserve_ratio=-1)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_paced_client_slows_before_the_bucket_empties(adapter: str) -> None:
    clock = FakeClock()
    replies = [Reply(200, {"RateLimit-Policy": '"k";q=60;w=60',
                           "RateLimit": f'"k";r={r};t={5 - r}'}, "x") for r in (4, 3, 2, 1, 0)]
    d = Driver(adapter, replies, clock=clock, pacer=Pacer(clock=clock))
    for _ in range(5):
        d.call("GET", "/v1/ledgers")
    # a bucket of 5, reserve 1: after 4, 3 and 2 points left a request still keeps it;
    # after 1 the fifth request waits 1 s (1 point a second) for the refill
    assert clock.sleeps == pytest.approx([1.0])
    assert len(d.server.sent) == 5
