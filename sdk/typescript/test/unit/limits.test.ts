/** Limits against hostile answers, with the fake clock: waits, lockouts, the pacer, header parsing. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { LockoutError, LockoutRegistry, Pacer, RateLimitInfo, retryPolicy } from "../../src/index.js";
import { driver, FakeClock, OK, rateLimitError, status, throttled, type Reply } from "./fakes.js";

test("a Retry-After above maxRetryAfterSeconds, or not finite, is not waited for", async () => {
  for (const ra of ["2200000", "99999999999", "9".repeat(400), "301"]) {
    const d = driver([throttled(ra), OK]);
    const err = rateLimitError(await d.call("/v1/ledgers"));
    assert.equal(err.reason, "retry_after_too_long", ra);
    assert.equal(err.retryAfter, Number(ra));
    assert.equal(d.server.sent.length, 1);
    assert.deepEqual(d.clock.sleeps, []);
  }
  const date = throttled("Fri, 31 Dec 9999 23:59:59 GMT", "r", { Date: "Thu, 01 Jan 1970 00:00:00 GMT" }, 503);
  assert.equal(rateLimitError(await driver([date, OK]).call("/v1/ledgers")).reason, "retry_after_too_long");
  const d = driver([throttled("300"), OK], { fraction: 0 });
  assert.equal(status(await d.call("/v1/ledgers")), 200);
  assert.deepEqual(d.clock.sleeps, [300]);
  const big = driver([throttled("2200000"), OK], { fraction: 0, policy: { maxRetryAfterSeconds: 1e7 } });
  assert.equal(status(await big.call("/v1/ledgers")), 200);
  assert.deepEqual(big.clock.sleeps, [2200000]);
  assert.throws(() => retryPolicy({ maxRetryAfterSeconds: -1 }), RangeError);
  assert.throws(() => retryPolicy({ maxLockoutSeconds: Number.NaN }), RangeError);
});

test("a lockout is capped at maxLockoutSeconds, even for an endless Retry-After", async () => {
  const boxed = throttled("9".repeat(400), "b", { "X-Penalty-Box-Status": "Active-Lockout" });
  const d = driver([boxed, OK]);
  assert.ok((await d.call("/v1/ledgers")) instanceof LockoutError);
  d.clock.advance(86399);
  assert.ok((await d.call("/v1/ledgers")) instanceof LockoutError);
  d.clock.advance(1);
  assert.equal(status(await d.call("/v1/ledgers")), 200);
  const short = driver([throttled("100", "b", { "X-Penalty-Box-Status": "Active-Lockout" }), OK],
    { policy: { maxLockoutSeconds: 10 } });
  assert.ok((await short.call("/v1/ledgers")) instanceof LockoutError);
  short.clock.advance(10);
  assert.equal(status(await short.call("/v1/ledgers")), 200);
});

test("lockouts need an API key and are kept per origin", async () => {
  const boxed = throttled("30", "b", { "X-Penalty-Box-Status": "Active-Lockout" });
  const anon = driver([boxed, OK], { headers: {} });
  assert.ok((await anon.call("/v1/ledgers")) instanceof LockoutError);
  assert.equal(status(await anon.call("/v1/ledgers")), 200);
  const clock = new FakeClock();
  const lockouts = new LockoutRegistry(clock);
  const a = driver([boxed], { clock, lockouts });
  const b = driver([OK], { clock, lockouts, baseUrl: "http://other.test" });
  assert.ok((await a.call("/v1/ledgers")) instanceof LockoutError);
  assert.equal(status(await b.call("/v1/ledgers")), 200);
  assert.ok((await a.call("/v1/ledgers")) instanceof LockoutError);
  assert.equal(a.server.sent.length, 1);
});

function paced(policy: string, limit: string): { pacer: Pacer; clock: FakeClock } {
  const clock = new FakeClock();
  const pacer = new Pacer({ clock });
  const h = new Headers({ "RateLimit-Policy": policy, RateLimit: limit });
  pacer.observe(RateLimitInfo.fromHeaders((n) => h.get(n)));
  return { pacer, clock };
}

test("the pacer's delay is checked against the deadline and maxRetryAfterSeconds before sleeping", async () => {
  const day = paced('"a";q=1;w=86400', '"a";r=0');
  const d = driver([OK], { ...day });
  const err = rateLimitError(await d.call("/v1/ledgers", { deadlineSeconds: 2 }));
  assert.equal(err.reason, "retry_after_too_long");
  const d2 = driver([OK], { ...day, policy: { maxRetryAfterSeconds: 1e6 } });
  assert.equal(rateLimitError(await d2.call("/v1/ledgers", { deadlineSeconds: 2 })).reason, "deadline");
  const forever = paced('"a";q=1;w=999999999999', '"a";r=0;t=1');
  const d3 = driver([OK], { ...forever });
  const e3 = rateLimitError(await d3.call("/v1/ledgers"));
  assert.equal(e3.reason, "retry_after_too_long");
  assert.ok(e3.retryAfter! > 1e9);
  for (const x of [d, d2, d3]) {
    assert.equal(x.server.sent.length, 0);
    assert.deepEqual(x.clock.sleeps, []);
  }
});

test("problem bodies above 64 KiB are not parsed", async () => {
  const pad = "x".repeat(70 * 1024);
  const big: Reply = { status: 429, headers: { "Content-Type": "application/problem+json" },
    body: JSON.stringify({ request_id: "big", pad }) };
  const err = rateLimitError(await driver([big], { policy: { maxAttempts: 1 } }).call("/v1/ledgers"));
  assert.equal(err.problem, null);
  assert.equal(err.requestId, null);
  assert.equal(await err.response!.text().then((t) => t.length), JSON.stringify({ request_id: "big", pad }).length);
  const declared: Reply = { status: 429, headers: { "Content-Type": "application/json", "Content-Length": "99999999" },
    body: '{"request_id":"cl"}' };
  const e2 = rateLimitError(await driver([declared], { policy: { maxAttempts: 1 } }).call("/v1/ledgers"));
  assert.equal(e2.problem, null);
  const small = rateLimitError(await driver([throttled("1", "small")], { policy: { maxAttempts: 1 } }).call("/v1/ledgers"));
  assert.equal(small.problem?.["request_id"], "small");
});
