/** Rule 10: the RateLimit / RateLimit-Policy fields, parsed as structured fields and exposed; the pacer. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { Pacer, RateLimitInfo, retryAfterSeconds } from "../../src/index.js";
import { driver, FakeClock } from "./fakes.js";

function fields(h: Record<string, string>): RateLimitInfo | null {
  const headers = new Headers(h);
  return RateLimitInfo.fromHeaders((n) => headers.get(n));
}

test("the gateway's fields parse into policies and the binding item", () => {
  const info = fields({
    "RateLimit-Policy": '"growth-key";q=3000;w=60, "growth-tenant";q=6000;w=60',
    RateLimit: '"growth-key";r=2990;t=1',
  })!;
  assert.deepEqual([...info.policies.keys()], ["growth-key", "growth-tenant"]);
  assert.equal(info.policies.get("growth-tenant")!.quota, 6000);
  assert.equal(info.binding!.name, "growth-key");
  assert.equal(info.remaining, 2990);
  assert.equal(info.reset, 1);
  assert.equal(info.policyOf(info.binding!), info.policies.get("growth-key"));
});

test("structured-field syntax is honoured", () => {
  const info = fields({
    "RateLimit-Policy": '"a\\"b";q=10;w=1;pk=:cHJvZg==:,   day;q=1000;w=86400',
    RateLimit: "day;r=5;t=3600;extra",
  })!;
  assert.deepEqual([...info.policies.keys()], ['a"b', "day"]);
  assert.equal(info.binding!.name, "day");
  assert.equal(info.binding!.params.get("extra"), true);
});

test("a manual box has no reset; the older draft's forms are read", () => {
  assert.equal(fields({ RateLimit: '"enterprise-key";r=0' })!.reset, null);
  const legacy = fields({ "RateLimit-Policy": "3000;w=60", "RateLimit-Remaining": "2412", "RateLimit-Reset": "18" })!;
  assert.equal(legacy.remaining, 2412);
  assert.equal(legacy.reset, 18);
  assert.equal(legacy.policyOf(legacy.binding!)!.quota, 3000);
});

test("malformed fields are ignored, not thrown", () => {
  for (const bad of ['"unterminated', "a;q=1,,", ";;", "(a b;q=1)"]) {
    const info = fields({ RateLimit: bad, "RateLimit-Policy": bad });
    assert.ok(info === null || (info.binding === null && info.policies.size === 0), bad);
  }
  assert.equal(fields({}), null);
});

test("Retry-After forms", () => {
  const cases: Array<[string, number | null]> = [
    ["0", 0], ["  12 ", 12], ["-3", null], ["1.5", null], ["soon", null],
    ["Tue, 01 Dec 2026 08:01:00 GMT", 60],
    ["Tuesday, 01-Dec-26 08:01:00 GMT", 60], // RFC 850
    ["Tue Dec  1 08:01:00 2026", 60], // asctime: no zone, UTC all the same
    ["Tue, 01 Dec 2026 07:59:00 GMT", 0],
  ];
  for (const [value, expected] of cases) {
    const h = new Headers({ "Retry-After": value, Date: "Tue, 01 Dec 2026 08:00:00 GMT" });
    assert.equal(retryAfterSeconds((n) => h.get(n), () => 0), expected, value);
  }
});

test("the client exposes the latest fields", async () => {
  const d = driver([
    { status: 200, headers: { "RateLimit-Policy": '"k";q=60;w=60', RateLimit: '"k";r=41;t=19' }, body: "x" },
    { status: 200, body: "no fields" },
  ]);
  await d.call("/v1/ledgers");
  assert.equal(d.client.rateLimit?.remaining, 41);
  await d.call("/v1/ledgers");
  assert.equal(d.client.rateLimit?.remaining, 41);
});

function observed(pacer: Pacer, r: number, t: number | null, q = 60, w = 60): void {
  pacer.observe(fields({ "RateLimit-Policy": `"k";q=${q};w=${w}`, RateLimit: `"k";r=${r}${t === null ? "" : `;t=${t}`}` }));
}

test("the pacer goes at once above the reserve and waits for the refill below it", async () => {
  const clock = new FakeClock();
  const pacer = new Pacer({ clock });
  assert.equal(pacer.delay(), 0);
  observed(pacer, 20, 40); // a bucket of 60: reserve 6
  assert.equal(pacer.delay(), 0);
  observed(pacer, 7, 53);
  assert.equal(pacer.delay(), 0);
  observed(pacer, 3, 57); // 1 point a second; wants 6 + 1: 4 short
  assert.equal(pacer.delay(), 4);
  assert.equal(pacer.delay(10), 13);
  clock.advance(1.5);
  assert.equal(pacer.delay(), 2.5);
  clock.advance(10);
  assert.equal(pacer.delay(), 0);
  await pacer.wait();
  assert.deepEqual(clock.sleeps, []);
});

test("the pacer sizes its reserve by the bucket; without a rate it never waits", () => {
  const clock = new FakeClock();
  const pacer = new Pacer({ clock });
  observed(pacer, 3, null); // no t: q is the size
  assert.equal(pacer.delay(), 4);
  observed(pacer, 2, 3); // a bucket of 5: reserve 1
  assert.equal(pacer.delay(), 0);
  observed(pacer, 1, 4);
  assert.equal(pacer.delay(), 1);
  const bare = new Pacer({ clock, reserveRatio: 0, minReserve: 0 });
  observed(bare, 0, 30, 120, 60);
  assert.equal(bare.delay(), 0.5);
  bare.observe(fields({ RateLimit: '"other";r=0;t=5' }));
  assert.equal(bare.delay(), 0);
  assert.throws(() => new Pacer({ reserveRatio: -1 }), RangeError);
});

test("a paced client slows before the bucket empties", async () => {
  const clock = new FakeClock();
  const replies = [4, 3, 2, 1, 0].map((r) => ({
    status: 200, headers: { "RateLimit-Policy": '"k";q=60;w=60', RateLimit: `"k";r=${r};t=${5 - r}` }, body: "x",
  }));
  const d = driver(replies, { clock, pacer: new Pacer({ clock }) });
  for (let i = 0; i < 5; i++) await d.call("/v1/ledgers");
  // a bucket of 5, reserve 1: only after 1 point left does the fifth request wait 1 s
  assert.deepEqual(clock.sleeps, [1]);
  assert.equal(d.server.sent.length, 5);
});

test("Retry-After: repeated values, strict HTTP-dates, huge values", () => {
  const cases: Array<[string, number | null]> = [
    ["5, 10", 10], ["10,5", 10], ["5, x", null], ["5, -1", null], ["x 9999", null], ["Sat 1 Jan 2050", null],
    ["1 2 3", null], ["Jan 99999", null], ["Tue, 01 Dec 2026 08:01:00 UTC", null], ["Tue, 1 Dec 2026 08:01:00 GMT", null],
    ["Tue, 01 Dec 2026 08:01:00 GMT, 5", null], ["Tue, 32 Dec 2026 08:01:00 GMT", null],
    ["9".repeat(400), Infinity], ["Tue, 01 Dec 2026 08:01:30 GMT", 90],
  ];
  for (const [value, expected] of cases) {
    const h = new Headers({ "Retry-After": value, Date: "Tue, 01 Dec 2026 08:00:00 GMT" });
    assert.equal(retryAfterSeconds((n) => h.get(n), () => 0), expected, value);
  }
});

test("integer fields of more than 18 digits are absent", () => {
  const h = new Headers({ "RateLimit-Remaining": "9".repeat(5000) });
  assert.equal(RateLimitInfo.fromHeaders((n) => h.get(n)), null);
  const ok = new Headers({ "RateLimit-Remaining": "9".repeat(18) });
  assert.equal(RateLimitInfo.fromHeaders((n) => ok.get(n))?.remaining, 999999999999999999);
});
