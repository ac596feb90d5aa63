/**
 * This package's response fields and problem bodies against the shared
 * vectors of sdk/responses.json (checked against the gateway itself by
 * responses-gateway.test.ts), from each case's rules and replies.
 */
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  DEFAULT_RESPONSE_CONF, failClosed, idempotencyKeyRequired, setRateLimit, leaseOutcome, periodSeconds, rateOutcome, respond, ruleView, type ResponseConf,
} from "../src/index.js";
import { decisionOfReply, differences, ruleConfig, VECTORS } from "./vectors.js";

const conf: ResponseConf = {
  problemBase: VECTORS.conf.problem_base, legacyHeaders: VECTORS.conf.legacy_headers,
  httpDateAfter: VECTORS.conf.http_date_after, manualBoxStatus: VECTORS.conf.manual_box_status,
  failClosedRetryAfter: VECTORS.conf.fail_closed_retry_after,
};

test("the vectors' conf is this package's default", () => {
  assert.deepEqual(conf, DEFAULT_RESPONSE_CONF);
});

for (const v of VECTORS.cases) {
  test(`responses.json: ${v.name}`, () => {
    const req = { path: v.request.path, requestId: v.request.request_id, tier: v.request.tier, nowMs: v.request.now_ms };
    const answer = v.expect.status === 503 ? failClosed(conf, req)
      : v.expect.status === 400 ? idempotencyKeyRequired(conf, req) : respond(conf, v.rules.map((r, i) => {
      const cfg = ruleConfig(r);
      const view = ruleView(cfg);
      const l = cfg.limiter;
      if (l.kind === "quota") view.window = periodSeconds(l.period, v.request.now_ms);
      const reply = v.replies[i]!;
      const outcome = l.kind === "lease"
        ? leaseOutcome(view, { granted: reply["granted"] as boolean, id: null, inUse: reply["in_use"] as number,
          max: reply["max"] as number, retryAfterMs: reply["retry_after_ms"] as number }, l.ttl ?? 300, l.expected ?? 1)
        : rateOutcome(view, decisionOfReply(reply), typeof cfg.cost === "number" ? cfg.cost : 1);
      return { rule: view, outcome };
    }), req);
    const headers = Object.fromEntries(Object.entries(answer.headers).map(([k, x]) => [k.toLowerCase(), x]));
    if (answer.contentType) headers["content-type"] = answer.contentType;
    const now = v.request.now_ms;
    assert.deepEqual(differences(v, answer.status ?? 200, headers, answer.body, { startMs: now, sentMs: now, seenMs: now }), []);
  });
}

test("legacy headers: the RateLimit-Limit / -Remaining / -Reset triple, no Reset for a box", () => {
  const legacy = { ...conf, legacyHeaders: true };
  const out: Record<string, string> = {};
  setRateLimit(out, legacy, { name: "k", limit: 10, remaining: -2, resetMs: 1500, window: 60 });
  assert.deepEqual(out, { "RateLimit": '"k";r=0;t=2', "RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "2" });
  const boxed: Record<string, string> = {};
  setRateLimit(boxed, legacy, { name: 'a "quoted" \\ name', limit: 3, remaining: 0, resetMs: 9000, boxed: true });
  assert.deepEqual(boxed, { "RateLimit": '"a \\"quoted\\" \\\\ name";r=0', "RateLimit-Limit": "3", "RateLimit-Remaining": "0" });
});
