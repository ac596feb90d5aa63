/**
 * What the per-request path prepares ahead: a rule's command made once
 * gives the very arguments of the one built in full, and the time budgets
 * served by one timer fail each late call at its own deadline, and only
 * the late ones.
 */
import assert from "node:assert/strict";
import { test } from "node:test";

import { Budget } from "../src/deadline.js";
import { prepareRate, rateCommand, RlUnavailableError, type RuleConfig } from "../src/index.js";

type Req = { tenant: string; key: string };
const REQ: Req = { tenant: "t{1}", key: "k1" };

const RULES: RuleConfig<Req>[] = [
  { name: "plain", limiter: { kind: "window", limit: 100, window: 60, mode: "fixed" } },
  { name: "sliding", limiter: { kind: "window", limit: 10, window: 1.5 } },
  { name: "key", scope: (r) => r.key, limiter: { kind: "bucket", rate: 100, burst: 200, period: 60,
    also: [{ name: "tenant", rate: 300, burst: 300, period: 3600 }, { name: "per-key", scope: (r) => r.key, rate: 5, burst: 5 }],
    strikes: { threshold: 20, window: 60 }, box: [300, 3600, 86400], offensesTtl: 600, jitter: 10 } },
  { name: "win", limiter: { kind: "window", limit: 50, window: 10, mode: "exact",
    also: [{ name: "win-tenant", limit: 500, window: 60 }], strikes: { threshold: 3, window: 10 } } },
  { name: "daily", limiter: { kind: "quota", limit: 1000, period: "DAY", also: [{ name: "monthly", limit: 20000, period: "MONTH" }] } },
];

test("a prepared rate command is the full one, for every kind and cost", () => {
  for (const rule of RULES) {
    const prepared = prepareRate("rl", rule);
    for (const cost of [0, 1, 2, 7, 150]) {
      const full = rateCommand("rl", rule, REQ, REQ.tenant, cost);
      const made = prepared(REQ, full.keys[0]!, REQ.tenant, cost);
      assert.deepEqual(made, full, `${rule.name}, cost ${cost}`);
      // a second request gets its own arguments
      assert.notEqual(prepared(REQ, full.keys[0]!, REQ.tenant, cost).args, made.args);
    }
  }
});

const never = new Promise<never>(() => {});
const settle = <T>(p: Promise<T>) => p.then((v) => ({ v }), (e: unknown) => ({ e }));

test("one budget fails each late call at its own deadline, and only the late ones", { timeout: 10_000 }, async () => {
  const budget = new Budget(120);
  const t0 = Date.now();
  const first = settle(budget.run(never, (v) => v));
  const answered = settle(budget.run(Promise.resolve(41), (v) => v + 1));
  await new Promise((r) => setTimeout(r, 60));
  const second = settle(budget.run(never, (v) => v));
  const failing = settle(budget.run(Promise.reject(new Error("refused")), (v) => v));
  const throwing = settle(budget.run(Promise.resolve(1), () => { throw new Error("bad reply"); }));
  assert.deepEqual(await answered, { v: 42 });
  assert.equal(((await failing) as { e: Error }).e.message, "refused");
  assert.equal(((await throwing) as { e: Error }).e.message, "bad reply");
  const a = await first;
  const firstAt = Date.now() - t0;
  assert.ok((a as { e: unknown }).e instanceof RlUnavailableError);
  assert.ok(firstAt >= 119, `first failed after ${firstAt} ms`);
  const b = await second;
  const secondAt = Date.now() - t0;
  assert.ok((b as { e: unknown }).e instanceof RlUnavailableError);
  assert.ok(secondAt >= 179, `second failed after ${secondAt} ms`);
});

test("a call answered in time is not failed later, and a later call gets its whole budget", { timeout: 10_000 }, async () => {
  const budget = new Budget(50);
  let answer!: (v: string) => void;
  const late = new Promise<string>((r) => { answer = r; });
  const call = settle(budget.run(late, (v) => v));
  setTimeout(() => answer("ok"), 10);
  assert.deepEqual(await call, { v: "ok" });
  await new Promise((r) => setTimeout(r, 80));
  // nothing pending: a new call gets its full budget again
  const t0 = Date.now();
  const again = await settle(budget.run(never, (v) => v));
  assert.ok((again as { e: unknown }).e instanceof RlUnavailableError);
  assert.ok(Date.now() - t0 >= 49);
});
