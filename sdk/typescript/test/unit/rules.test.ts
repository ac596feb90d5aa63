/** The client SDK rules, with a fake clock and a scripted random source: nothing here sleeps for real. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { LockoutError, LockoutRegistry, retryPolicy } from "../../src/index.js";
import { driver, FakeClock, OK, rateLimitError, status, throttled, type Reply } from "./fakes.js";

function near(actual: number[], expected: number[]): void {
  assert.equal(actual.length, expected.length, `${actual} vs ${expected}`);
  actual.forEach((a, i) => assert.ok(Math.abs(a - expected[i]!) < 1e-9, `${actual} vs ${expected}`));
}

// 1. full-jitter exponential backoff

test("backoff is full-jitter exponential with the default parameters", async () => {
  const d = driver([throttled(null)], { fraction: 1 });
  assert.equal(rateLimitError(await d.call("/v1/ledgers")).reason, "attempts_exhausted");
  assert.equal(d.server.sent.length, 5);
  // uniform(0, min(30, 0.5 * 2^n)) drawn at its top, plus 10 %
  near(d.clock.sleeps, [0.55, 1.1, 2.2, 4.4]);
});

test("backoff is capped", async () => {
  const d = driver([throttled(null)], { fraction: 1, policy: { baseSeconds: 10, capSeconds: 30 } });
  await d.call("/v1/ledgers");
  near(d.clock.sleeps, [11, 22, 33, 33]);
});

test("backoff draws from zero", async () => {
  const d = driver([throttled(null), OK], { fraction: 0 });
  assert.equal(status(await d.call("/v1/ledgers")), 200);
  assert.deepEqual(d.clock.sleeps, []);
});

// 2. Retry-After as a hard floor

test("Retry-After delta-seconds is the floor", async () => {
  const d = driver([throttled("7"), OK], { fraction: 0 });
  assert.equal(status(await d.call("/v1/ledgers")), 200);
  assert.deepEqual(d.clock.sleeps, [7]);
});

test("an HTTP-date Retry-After is relative to the Date header, not the local clock", async () => {
  const clock = new FakeClock(946_684_800); // 2000-01-01: far off
  const reply = throttled("Tue, 01 Dec 2026 08:00:12 GMT", "r", { Date: "Tue, 01 Dec 2026 08:00:00 GMT" });
  const d = driver([reply, OK], { fraction: 0, clock });
  assert.equal(status(await d.call("/v1/ledgers")), 200);
  assert.deepEqual(d.clock.sleeps, [12]);
});

test("an HTTP-date without Date falls back to the wall clock", async () => {
  const clock = new FakeClock(1_796_112_000); // 2026-12-01 08:00:00 UTC
  const d = driver([throttled("Tue, 01 Dec 2026 08:00:05 GMT"), OK], { fraction: 0, clock });
  await d.call("/v1/ledgers");
  assert.deepEqual(d.clock.sleeps, [5]);
});

test("an unreadable Retry-After leaves the backoff", async () => {
  for (const bad of ["soon", "-3", "1.5"]) {
    const d = driver([throttled(bad), OK], { fraction: 1 });
    assert.equal(status(await d.call("/v1/ledgers")), 200);
    near(d.clock.sleeps, [0.55]);
  }
});

// 3. wait max(Retry-After, backoff) plus 0-10 % of it

test("the wait is the larger of Retry-After and backoff, plus up to 10 %", async () => {
  const d = driver([throttled("2"), throttled("2"), OK], { fraction: 1, policy: { baseSeconds: 4 } });
  await d.call("/v1/ledgers");
  near(d.clock.sleeps, [4.4, 8.8]);
  const d2 = driver([throttled("9"), OK], { fraction: 0.5 });
  await d2.call("/v1/ledgers");
  near(d2.clock.sleeps, [9.45]);
});

// 4. never sooner than Retry-After

test("never sooner than Retry-After, whatever the random draws", async () => {
  const ras = ["1", "3", "0", "12"];
  for (let seed = 1; seed <= 20; seed++) {
    let x = seed;
    const random = () => {
      x = (x * 16807) % 2147483647; // Park-Miller: reproducible draws
      return (x - 1) / 2147483646;
    };
    const d = driver([...ras.map((ra) => throttled(ra)), OK], { random });
    assert.equal(status(await d.call("/v1/ledgers")), 200);
    d.clock.sleeps.forEach((wait, i) => {
      assert.ok(wait >= Number(ras[i]), `${wait} < ${ras[i]}`);
      assert.ok(wait <= Math.max(Number(ras[i]), 30) * 1.1);
    });
  }
});

// 5. Active-Lockout

test("Active-Lockout reaches the caller at once and locks the key until Retry-After", async () => {
  const boxed = throttled("30", "req-boxed", { "X-Penalty-Box-Status": "Active-Lockout" });
  const d = driver([boxed, OK]);
  const err = rateLimitError(await d.call("/v1/ledgers"));
  assert.ok(err instanceof LockoutError);
  assert.equal(err.reason, "lockout");
  assert.equal(err.requestId, "req-boxed");
  assert.equal(err.retryAfter, 30);
  assert.equal(err.attempts, 1);
  assert.equal(d.server.sent.length, 1);
  assert.deepEqual(d.clock.sleeps, []);
  d.clock.advance(10);
  const again = rateLimitError(await d.call("/v1/ledgers/7"));
  assert.ok(again instanceof LockoutError);
  assert.equal(again.attempts, 0);
  assert.ok(Math.abs(again.retryAfter! - 20) < 1e-9);
  assert.equal(d.server.sent.length, 1);
  assert.equal(status(await d.call("/v1/ledgers", { headers: { "X-Api-Key": "key-b" } })), 200);
  d.clock.advance(20);
  assert.equal(status(await d.call("/v1/ledgers")), 200);
  assert.equal(d.server.sent.length, 3);
});

test("a lockout without Retry-After (a manual box) is not retried nor remembered", async () => {
  const manual: Reply = { status: 403, headers: { "X-Penalty-Box-Status": "Active-Lockout" }, body: { request_id: "m" } };
  const d = driver([manual, OK]);
  const err = rateLimitError(await d.call("/v1/ledgers"));
  assert.ok(err instanceof LockoutError);
  assert.equal(err.status, 403);
  assert.equal(err.retryAfter, null);
  assert.equal(status(await d.call("/v1/ledgers")), 200);
});

test("a shared lockout registry spans clients", async () => {
  const clock = new FakeClock();
  const lockouts = new LockoutRegistry(clock);
  const a = driver([throttled("5", "x", { "X-Penalty-Box-Status": "Active-Lockout" })], { clock, lockouts });
  const b = driver([OK], { clock, lockouts });
  assert.ok((await a.call("/v1/ledgers")) instanceof LockoutError);
  assert.ok((await b.call("/v1/ledgers")) instanceof LockoutError);
  assert.equal(b.server.sent.length, 0);
});

// 6. the token endpoint

test("a 429 on the token endpoint is retried at most twice, with the same credential", async () => {
  const d = driver([throttled("1", "req-tok")], { headers: { Authorization: "Basic YWxpY2U6cmlnaHQ=" } });
  const err = rateLimitError(
    await d.call("/v1/auth/token", { method: "POST", body: new URLSearchParams({ grant_type: "client_credentials" }) }),
  );
  assert.equal(err.reason, "attempts_exhausted");
  assert.equal(err.requestId, "req-tok");
  assert.equal(err.attempts, 3);
  assert.equal(d.server.sent.length, 3);
  assert.deepEqual(new Set(d.server.sent.map((s) => s.headers.get("authorization"))), new Set(["Basic YWxpY2U6cmlnaHQ="]));
  assert.equal(new Set(d.server.sent.map((s) => s.body)).size, 1);
});

// 7. idempotency

test("a POST without an Idempotency-Key is not retried", async () => {
  const d = driver([throttled("1", "req-post"), OK]);
  const err = rateLimitError(await d.call("/v1/ledgers/1/entries", { method: "POST", body: "{}" }));
  assert.equal(err.reason, "not_retryable");
  assert.equal(err.requestId, "req-post");
  assert.equal(d.server.sent.length, 1);
  assert.equal(d.server.sent[0]!.headers.get("idempotency-key"), null);
});

for (const how of ["generated", "explicit", "policy", "header"] as const) {
  test(`a POST with an Idempotency-Key (${how}) is retried with the same key and body`, async () => {
    const d = driver([throttled(), throttled(), OK], {
      newIdempotencyKey: () => "generated-key",
      ...(how === "policy" ? { policy: { autoIdempotencyKey: true } } : {}),
    });
    const extra = {
      generated: { idempotencyKey: true },
      explicit: { idempotencyKey: "my-key" },
      policy: {},
      header: { headers: { "Idempotency-Key": "my-key" } },
    }[how];
    const r = await d.call("/v1/ledgers/reconcile", { method: "POST", body: '{"ledger_id":"L1"}', ...extra });
    assert.equal(status(r), 200);
    const expected = how === "explicit" || how === "header" ? "my-key" : "generated-key";
    assert.deepEqual(d.server.sent.map((s) => s.headers.get("idempotency-key")), [expected, expected, expected]);
    assert.deepEqual(d.server.sent.map((s) => s.body), Array(3).fill('{"ledger_id":"L1"}'));
  });
}

test("generated keys differ per call; idempotent requests get none", async () => {
  const d = driver([OK], { policy: { autoIdempotencyKey: true } });
  await d.call("/v1/ledgers/reconcile", { method: "POST" });
  await d.call("/v1/ledgers/reconcile", { method: "POST" });
  await d.call("/v1/ledgers");
  const [a, b, c] = d.server.sent.map((s) => s.headers.get("idempotency-key"));
  assert.ok(a && b && a !== b);
  assert.equal(c, null);
});

test("idempotent methods are retried", async () => {
  for (const method of ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"]) {
    const d = driver([throttled(), OK]);
    assert.equal(status(await d.call("/v1/ledgers/1", { method })), 200);
    assert.equal(d.server.sent.length, 2);
  }
});

test("the gateway's fail-closed 503 is retried after its Retry-After; other errors are returned", async () => {
  const d = driver([throttled("15", "x", {}, 503), OK], { fraction: 0 });
  assert.equal(status(await d.call("/v1/reports/audit-export")), 200);
  assert.deepEqual(d.clock.sleeps, [15]);
  const d2 = driver([{ status: 500, headers: { "Retry-After": "1" }, body: "boom" }, OK]);
  assert.equal(status(await d2.call("/v1/ledgers")), 500);
  assert.equal(d2.server.sent.length, 1);
});

// 8. a 409 goes to the hook

test("a 409 calls the hook instead of resubmitting; without a hook it is returned", async () => {
  const conflict: Reply = { status: 409, headers: { "Retry-After": "3" }, body: { status: 409, request_id: "c" } };
  const seen: number[] = [];
  const d = driver([conflict, OK]);
  const r = await d.call("/v1/ledgers/reconcile", {
    method: "POST",
    idempotencyKey: "k1",
    onConflict: async (resp) => {
      seen.push(resp.status);
      return new Response("job-status", { status: 200 });
    },
  });
  assert.ok(r instanceof Response);
  assert.equal(await r.text(), "job-status");
  assert.deepEqual(seen, [409]);
  assert.equal(d.server.sent.length, 1);
  assert.deepEqual(d.clock.sleeps, []);
  const d2 = driver([conflict, OK]);
  assert.equal(status(await d2.call("/v1/ledgers/reconcile", { method: "POST", idempotencyKey: "k1" })), 409);
  assert.equal(d2.server.sent.length, 1);
});

// 9. the last attempt and the deadline

test("the last attempt fails with the last 429 and its request_id", async () => {
  const d = driver([1, 2, 3].map((i) => throttled("1", `req-${i}`)), { policy: { maxAttempts: 3 } });
  const err = rateLimitError(await d.call("/v1/ledgers"));
  assert.equal(err.reason, "attempts_exhausted");
  assert.equal(err.requestId, "req-3");
  assert.equal(err.status, 429);
  assert.equal(err.attempts, 3);
  assert.equal(err.problem?.["request_id"], "req-3");
  assert.equal(err.response?.status, 429);
  assert.equal(d.clock.sleeps.length, 2);
});

test("a wait past the deadline fails at once", async () => {
  const d = driver([throttled("1", "req-a"), throttled("10", "req-b"), OK], { fraction: 0 });
  const err = rateLimitError(await d.call("/v1/ledgers", { deadlineSeconds: 5 }));
  assert.equal(err.reason, "deadline");
  assert.equal(err.requestId, "req-b");
  assert.equal(err.retryAfter, 10);
  assert.equal(d.server.sent.length, 2);
  assert.deepEqual(d.clock.sleeps, [1]);
  const d2 = driver([throttled("4"), OK], { fraction: 0, policy: { deadlineSeconds: 3 } });
  assert.equal(rateLimitError(await d2.call("/v1/ledgers")).reason, "deadline");
  assert.equal(d2.server.sent.length, 1);
});

test("request_id falls back to the X-Request-Id header", async () => {
  const d = driver([{ status: 429, headers: { "X-Request-Id": "hdr-id" }, body: "plain" }], { policy: { maxAttempts: 1 } });
  const err = rateLimitError(await d.call("/v1/ledgers"));
  assert.equal(err.requestId, "hdr-id");
  assert.equal(err.problem, null);
});

test("policy validation", () => {
  assert.throws(() => retryPolicy({ maxAttempts: 0 }), RangeError);
  assert.throws(() => retryPolicy({ baseSeconds: -1 }), RangeError);
});

test("a Request object with a body is sent again as it is, and its headers are kept", async () => {
  const d = driver([throttled(), OK]);
  const req = new Request("http://api.test/v1/ledgers/1", {
    method: "PUT",
    headers: { "Content-Type": "application/json", "X-Api-Key": "key-z" },
    body: '{"name":"L1"}',
  });
  assert.equal(status(await d.call(req)), 200);
  assert.deepEqual(d.server.sent.map((s) => [s.method, s.body, s.headers.get("x-api-key")]), [
    ["PUT", '{"name":"L1"}', "key-z"],
    ["PUT", '{"name":"L1"}', "key-z"],
  ]);
});
