"""Fields a hostile or broken server may send: huge or malformed
``Retry-After`` and integer fields are absent or infinite, never an
exception; HTTP-dates are read only in RFC 9110's strict forms."""

from __future__ import annotations

import math
from typing import Dict, Optional

import pytest

from rl_client import RateLimitInfo, retry_after_seconds

from .fakes import ADAPTERS, Driver, Reply, status_of

DATE = "Tue, 01 Dec 2026 08:00:00 GMT"


def _retry_after(value: str, date: Optional[str] = DATE) -> Optional[float]:
    h: Dict[str, str] = {"retry-after": value}
    if date is not None:
        h["date"] = date
    return retry_after_seconds(lambda n: h.get(n.lower()), lambda: 0.0)


@pytest.mark.parametrize("value,expected", [
    ("9" * 18, float(10**18 - 1)),
    ("9" * 19, math.inf), ("9" * 400, math.inf), ("9" * 5000, math.inf),
    ("5, 10", 10.0), ("10, 5", 10.0), ("5,10", 10.0), ("5, " + "9" * 400, math.inf),
    ("5, soon", None), ("5, Tue, 01 Dec 2026 08:01:00 GMT", None), (", 5", None),
    ("x 9999", None), ("Dec 9999", None), ("9999", 9999.0),
    ("Tue, 01 Dec 2026 08:01:00 +0000", None),  # IMF-fixdate says GMT
    ("Tue, 1 Dec 2026 08:01:00 GMT", None),  # two-digit day
    ("Tue, 31 Feb 2026 08:01:00 GMT", None),
    ("Fri, 31 Dec 9999 23:59:59 GMT", 253402300799.0 - 1796112000.0),
])
def test_retry_after_is_strict_and_never_raises(value: str, expected: Optional[float]) -> None:
    assert _retry_after(value) == expected


def test_a_date_header_that_is_not_strict_is_not_the_reference() -> None:
    h = {"retry-after": "Tue, 01 Dec 2026 08:01:00 GMT", "date": "x 9999"}
    assert retry_after_seconds(lambda n: h.get(n.lower()), lambda: 1796112000.0) == 60.0


@pytest.mark.parametrize("digits", [19, 400, 5000])
def test_long_integer_fields_are_absent(digits: int) -> None:
    h = {"ratelimit-remaining": "9" * digits, "ratelimit-reset": "9" * digits}
    assert RateLimitInfo.from_headers(lambda n: h.get(n.lower())) is None
    h = {"ratelimit-remaining": "7", "ratelimit-reset": "9" * digits}
    info = RateLimitInfo.from_headers(lambda n: h.get(n.lower()))
    assert info is not None and info.remaining == 7 and info.reset is None


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_200_with_a_5000_digit_field_is_returned(adapter: str) -> None:
    d = Driver(adapter, [Reply(200, {"RateLimit-Remaining": "9" * 5000}, "ok")])
    assert status_of(d.call("GET", "/v1/ledgers")) == 200
