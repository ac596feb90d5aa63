"""Parsing of the rate-limit response fields: ``Retry-After`` and the
``RateLimit`` / ``RateLimit-Policy`` structured fields
(draft-ietf-httpapi-ratelimit-headers), with the older
``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` triple as a fallback.

Nothing here raises on a malformed header: an unreadable field is absent.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

from http_sfv.item import Item as SfItem
from http_sfv.list import List as SfList

#: Reads one response header by name (case-insensitive), ``None`` if absent.
HeaderGetter = Callable[[str], Optional[str]]

Number = Union[int, float]


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_LONG_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_TIME = r"(\d{2}):(\d{2}):(\d{2})"
_MON = "(" + "|".join(_MONTHS) + ")"
# RFC 9110 section 5.6.7: the three forms, exactly (no comments, no zones but GMT)
_IMF_FIXDATE = re.compile(
    r"(?:" + "|".join(_DAYS) + r"), (\d{2}) " + _MON + r" (\d{4}) " + _TIME + r" GMT")
_RFC850 = re.compile(
    r"(?:" + "|".join(_LONG_DAYS) + r"), (\d{2})-" + _MON + r"-(\d{2}) " + _TIME + r" GMT")
_ASCTIME = re.compile(
    r"(?:" + "|".join(_DAYS) + r") " + _MON + r" ( \d|\d{2}) " + _TIME + r" (\d{4})")

#: Integer fields with more digits than this are treated as absent.
MAX_INT_DIGITS = 18


def _http_date(value: str) -> Optional[float]:
    """The Unix time of an HTTP-date in strict IMF-fixdate, RFC 850 or
    asctime form (RFC 9110), or None."""
    value = value.strip()
    fields: Optional[Tuple[str, str, str, str, str, str]] = None  # day, month, year, h, m, s
    m = _IMF_FIXDATE.fullmatch(value)
    if m is not None:
        fields = (m[1], m[2], m[3], m[4], m[5], m[6])
    elif (m := _RFC850.fullmatch(value)) is not None:
        two = int(m[3])
        # a two-digit year: the closest century (RFC 9110's 50-year rule, simplified)
        fields = (m[1], m[2], str(two + (2000 if two < 70 else 1900)), m[4], m[5], m[6])
    elif (m := _ASCTIME.fullmatch(value)) is not None:
        fields = (m[2].strip(), m[1], m[6], m[3], m[4], m[5])
    if fields is None:
        return None
    day, month, year, hour, minute, second = fields
    try:
        parsed = datetime.datetime(int(year), _MONTHS.index(month) + 1, int(day), int(hour),
                                   int(minute), int(second), tzinfo=datetime.timezone.utc)
    except ValueError:  # e.g. 31 Feb, hour 25
        return None
    return parsed.timestamp()


def _delta_seconds(raw: str) -> Optional[float]:
    """A delta-seconds value (digits only), infinity when it is too long to
    be a real wait, or None when ``raw`` is not delta-seconds."""
    if not (raw.isascii() and raw.isdigit()):
        return None
    return float(int(raw)) if len(raw) <= MAX_INT_DIGITS else math.inf


def retry_after_seconds(get: HeaderGetter, wall_now: Callable[[], float]) -> Optional[float]:
    """The wait a response's ``Retry-After`` asks for, in seconds (>= 0), or None.

    Delta-seconds (digits only) are taken as they are; more than
    ``MAX_INT_DIGITS`` digits give ``math.inf`` (the engine refuses such a
    wait). Several values (a repeated header, joined with ``", "``) give
    their maximum when every one is delta-seconds, else None. An HTTP-date
    (strictly one of RFC 9110's three forms) is taken relative to the
    response's own ``Date`` header (the server's clock), never the local
    clock; only a response without a readable ``Date`` falls back to
    ``wall_now()`` (Unix seconds), since there is nothing else to compare with.
    """
    raw = get("Retry-After")
    if raw is None:
        return None
    raw = raw.strip()
    delta = _delta_seconds(raw)
    if delta is not None:
        return delta
    if "," in raw:
        parts = [_delta_seconds(part.strip()) for part in raw.split(",")]
        if all(part is not None for part in parts):
            return max(part for part in parts if part is not None)
    target = _http_date(raw)
    if target is None:
        return None
    date_header = get("Date")
    reference = _http_date(date_header) if date_header is not None else None
    if reference is None:
        reference = wall_now()
    return max(0.0, target - reference)


@dataclass(frozen=True)
class QuotaPolicy:
    """One item of ``RateLimit-Policy``: ``"name";q=quota;w=window``.

    ``quota`` is the number of quota units (the gateway's points) per
    ``window`` seconds; ``params`` holds every parameter as sent.
    """

    name: str
    quota: Optional[Number]
    window: Optional[Number]
    params: Mapping[str, object] = field(default_factory=dict)

    @property
    def rate(self) -> Optional[float]:
        """Quota units per second (``quota / window``), or None when unknown."""
        if self.quota is None or not self.window or self.window <= 0:
            return None
        return float(self.quota) / float(self.window)


@dataclass(frozen=True)
class RateLimitItem:
    """One item of ``RateLimit``: ``"name";r=remaining;t=reset``.

    ``remaining`` is the quota left (whole units); ``reset`` the seconds until
    the quota is full again (None when the server sent none).
    """

    name: str
    remaining: Optional[Number]
    reset: Optional[Number]
    params: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class RateLimitInfo:
    """The rate-limit state one response announced.

    ``policies`` maps each ``RateLimit-Policy`` item's name to it (in order);
    ``limits`` are the ``RateLimit`` items. The first ``RateLimit`` item is
    the binding one (the rl gateway sends exactly one: the bucket that binds).
    """

    policies: Mapping[str, QuotaPolicy]
    limits: Tuple[RateLimitItem, ...]

    @property
    def binding(self) -> Optional[RateLimitItem]:
        """The binding ``RateLimit`` item, or None."""
        return self.limits[0] if self.limits else None

    @property
    def remaining(self) -> Optional[Number]:
        """``r`` of the binding item: what is left before the bucket is empty."""
        item = self.binding
        return item.remaining if item is not None else None

    @property
    def reset(self) -> Optional[Number]:
        """``t`` of the binding item: seconds until the bucket is full again."""
        item = self.binding
        return item.reset if item is not None else None

    def policy_of(self, item: RateLimitItem) -> Optional[QuotaPolicy]:
        """The policy a ``RateLimit`` item names; an unnamed item (the older
        draft's form) takes the only policy when there is exactly one."""
        found = self.policies.get(item.name)
        if found is None and item.name == "" and len(self.policies) == 1:
            return next(iter(self.policies.values()))
        return found

    @classmethod
    def from_headers(cls, get: HeaderGetter) -> Optional["RateLimitInfo"]:
        """Parses a response's fields; None when it carries none."""
        policies = _parse_policies(get("RateLimit-Policy"))
        limits = _parse_limits(get("RateLimit"))
        if not limits:
            legacy = _legacy_item(get)
            if legacy is not None:
                limits = (legacy,)
        if not policies and not limits:
            return None
        return cls(policies=policies, limits=limits)


def _sf_list(raw: Optional[str]) -> Optional[SfList]:
    if raw is None:
        return None
    parsed = SfList()
    try:
        parsed.parse(raw.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        return None
    return parsed


def _number(value: object) -> Optional[Number]:
    # bool is an int in Python; a structured-field Boolean is not a number
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _name_and_params(member: object) -> Optional[Tuple[str, Dict[str, object], object]]:
    """(name, params, bare value) of a list member that is an Item; inner
    lists are skipped. A String or Token names the item; an Integer (the
    older draft's ``3000;w=60``) is unnamed and returned as the value."""
    if not isinstance(member, SfItem):
        return None
    params = dict(member.params)
    value = member.value
    if isinstance(value, str):
        return str(value), params, None
    return "", params, value


def _parse_policies(raw: Optional[str]) -> Dict[str, QuotaPolicy]:
    out: Dict[str, QuotaPolicy] = {}
    for member in _sf_list(raw) or []:
        parts = _name_and_params(member)
        if parts is None:
            continue
        name, params, bare = parts
        quota = _number(params.get("q"))
        if quota is None:
            quota = _number(bare)
        out.setdefault(name, QuotaPolicy(name, quota, _number(params.get("w")), params))
    return out


def _parse_limits(raw: Optional[str]) -> Tuple[RateLimitItem, ...]:
    out = []
    for member in _sf_list(raw) or []:
        parts = _name_and_params(member)
        if parts is None:
            continue
        name, params, _ = parts
        out.append(
            RateLimitItem(name, _number(params.get("r")), _number(params.get("t")), params)
        )
    return tuple(out)


def _int_header(get: HeaderGetter, name: str) -> Optional[int]:
    raw = get(name)
    if raw is None:
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > MAX_INT_DIGITS:
        return None
    return int(raw)


def _legacy_item(get: HeaderGetter) -> Optional[RateLimitItem]:
    remaining = _int_header(get, "RateLimit-Remaining")
    if remaining is None:
        return None
    return RateLimitItem("", remaining, _int_header(get, "RateLimit-Reset"))
