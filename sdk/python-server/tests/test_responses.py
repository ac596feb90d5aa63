"""The response fields and problem bodies against the shared test vectors
(sdk/responses.json, checked against the real gateway): each case's rules
and replies go through the functions the middleware answers with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from rl_server import responses
from rl_server.responses import Binding, Conf, Policy

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "responses.json").read_text())
CONF = Conf(**VECTORS["conf"])
PERIODS = {"DAY": 86400.0, "WEEK": 7 * 86400.0}


def window_of(kind: str, lim: Dict[str, Any]) -> Optional[float]:
    if kind == "bucket":
        return float(lim["period"])
    if kind == "window":
        return float(lim["window"])
    return PERIODS[lim["period"]]  # the vectors' quotas are daily or weekly


def policies_of(rules: List[Dict[str, Any]]) -> List[Policy]:
    out = []
    for r in rules:
        lim, unit = r["limiter"], r.get("unit", "requests")
        if lim["kind"] == "lease":
            out.append(Policy(r["name"], lim["max"], None, "concurrent-requests"))
            continue
        out.append(Policy(r["name"], lim.get("rate", lim.get("limit")), window_of(lim["kind"], lim), unit))
        for a in lim.get("also", []):
            out.append(Policy(a["name"], a.get("rate", a.get("limit")), window_of(lim["kind"], a), unit))
    return out


def answer(case: Dict[str, Any]) -> responses.Answer:
    """What the middleware answers for the case's rules and replies."""
    req = case["request"]
    now = req["now_ms"] / 1000
    rules = case["rules"]
    if not rules:
        return responses.idempotency_required(CONF, req["path"], req["request_id"])
    policies = policies_of(rules)
    bindings: List[Binding] = []
    for rule, reply in zip(rules, case["replies"]):
        lim = rule["limiter"]
        if "error" in reply:
            assert rule.get("on_redis_failure") == "closed"
            return responses.fail_closed(CONF, req["path"], req["request_id"], req["tier"])
        refusal = rule.get("on_refusal", {})
        if lim["kind"] == "lease":
            if not reply["granted"]:
                return responses.lease_refusal(
                    CONF, policies, rule["name"], lim["max"], lim["ttl"], lim.get("expected", 1),
                    refusal.get("status", 429), reply["retry_after_ms"], req["path"], req["request_id"],
                    req["tier"])
            continue
        also = [rule] + lim.get("also", [])
        b = also[reply["binding"]]
        spec = lim if reply["binding"] == 0 else b
        boxed = reply["status"] == "boxed"
        binding = Binding(b["name"], reply["limit"], 0 if boxed else reply["remaining"],
                          None if reply["reset_ms"] < 0 else reply["reset_ms"],
                          window_of(lim["kind"], spec), clamp=lim["kind"] != "bucket", boxed=boxed)
        if reply["status"] in ("throttled", "boxed"):
            view = responses.Limiter(
                rule["name"], lim["kind"], rule.get("unit", "requests"), window_of(lim["kind"], spec),
                rule.get("cost", 1), box=tuple(lim["box"]) if "box" in lim else None,
                strikes_threshold=lim.get("strikes", {}).get("threshold"),
                upgrade_url=refusal.get("upgrade_url"))
            return responses.limiter_refusal(
                CONF, policies, view, binding, reply["box_level"], reply["retry_after_ms"],
                reply["strikes_remaining"], req["path"], req["request_id"], req["tier"], now=now)
        bindings.append(binding)
    from rl_server.asgi import _tightest
    return responses.admitted(CONF, policies, _tightest(bindings))


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_vector(case: Dict[str, Any]) -> None:
    got = answer(case)
    want = case["expect"]
    assert got.status == want["status"]
    assert got.headers == want["headers"]
    if "body" in want:
        assert got.body == want["body"]
        # the bytes the middleware sends parse to the same body
        assert json.loads(responses.encode(got.body)) == want["body"]
    else:
        assert got.body is None
