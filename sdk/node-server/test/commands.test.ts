/**
 * The typed commands against real servers (redis-server and Valkey with
 * the module), through node-redis and ioredis, standalone and as a
 * two-node cluster: each reply's fields at their boundaries.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Cluster, Redis } from "ioredis";
import { createClient, createCluster } from "redis";

import { forIoredis, forRedis, RlCommands, RlConfigError } from "../src/index.js";
import { Server, SERVERS, startCluster } from "./servers.js";

/** Every command once, with keys under `tag` (one hash slot). */
async function exercise(rl: RlCommands, tag: string): Promise<void> {
  const k = (n: string) => `rl:{${tag}}:${n}`;
  // a bucket of 2 refilling 1 per 60 s, with a tenant bucket of 10
  const take = { capacity: 2, tokens: 1, period: 60, also: [{ key: k("tenant"), capacity: 10, tokens: 10, period: 60 }] };
  const a = await rl.take(k("b"), take);
  assert.deepEqual({ ...a, resetMs: undefined }, { status: "allowed", allowed: true, limit: 2, remaining: 1,
    resetMs: undefined, retryAfterMs: 0, penaltyLevel: 0, strikesRemaining: null, binding: 0, granted: 1 });
  assert.ok(a.resetMs! > 59_000 && a.resetMs! <= 60_000);
  await rl.take(k("b"), take);
  const t = await rl.take(k("b"), { ...take, strikes: { threshold: 2, window: 60 } });
  assert.equal(t.status, "throttled");
  assert.equal(t.allowed, false);
  assert.equal(t.remaining, 0);
  assert.equal(t.granted, 0);
  assert.equal(t.strikesRemaining, 2);
  assert.ok(t.retryAfterMs! > 0 && t.retryAfterMs! <= 60_000);
  // two early retries trip the box (level 1, 5 s)
  await rl.take(k("b"), { ...take, strikes: { threshold: 2, window: 60 }, box: [5, 10, 20] });
  const boxed = await rl.take(k("b"), { ...take, strikes: { threshold: 2, window: 60 }, box: [5, 10, 20] });
  assert.equal(boxed.status, "boxed");
  assert.equal(boxed.penaltyLevel, 1);
  assert.ok(boxed.retryAfterMs! > 4000 && boxed.retryAfterMs! <= 5000);
  const st = await rl.box.status(k("b"));
  assert.equal(st.level, 1);
  assert.equal(st.offenses, 1);
  assert.equal(await rl.box.release(k("b"), true), true);
  // with every, the first refusal is a strike too (a lockout)
  const lockout = { strikes: { threshold: 1, window: 60, every: true }, box: [5, 10, 20] as [number, number, number] };
  assert.equal((await rl.window(k("lock"), { limit: 1, window: 60, ...lockout })).status, "allowed");
  assert.equal((await rl.window(k("lock"), { limit: 1, window: 60, ...lockout })).status, "boxed");
  const manual = await rl.box.trip(k("m"), 2, 0);
  assert.deepEqual(manual, { level: 2, ttlMs: null, offenses: 1, strikes: 0 });
  const mb = await rl.take(k("m"), { capacity: 1, tokens: 1, period: 1 });
  assert.equal(mb.status, "boxed");
  assert.equal(mb.retryAfterMs, null);
  assert.equal(mb.resetMs, null);
  // the tenant bucket binds when it is the tighter one
  const tenant = await rl.take(k("c"), { capacity: 100, tokens: 100, period: 60, cost: 7,
    also: [{ key: k("tenant"), capacity: 10, tokens: 10, period: 60 }] });
  assert.equal(tenant.binding, 1);
  assert.equal(tenant.remaining, 1);
  // partial grants
  const part = await rl.take(k("p"), { capacity: 5, tokens: 1, period: 60, cost: 8, partial: { min: 2 } });
  assert.equal(part.granted, 5);
  // windows: 3 per 10 s, sliding and exact; fixed per hour (a boundary
  // between the two calls would start a new count)
  for (const mode of ["sliding", "exact", "fixed"] as const) {
    const w = { limit: 3, window: mode === "fixed" ? 3600 : 10, mode, cost: 2 };
    assert.equal((await rl.window(k(`w-${mode}`), w)).remaining, 1);
    const r = await rl.window(k(`w-${mode}`), w);
    assert.equal(r.status, "throttled");
    assert.ok(r.retryAfterMs! > 0 && r.retryAfterMs! <= 2_000 * w.window, `${mode}: ${r.retryAfterMs}`);
  }
  const q = await rl.quota(k("q"), { limit: 100, period: "month", cost: 25 });
  assert.equal(q.remaining, 75);
  assert.equal((await rl.quota(k("q"), { limit: 100, period: "month", cost: 80, peek: true })).status, "throttled");
  assert.equal((await rl.distinct(k("d"), "alice", { limit: 1, window: 60 })).status, "allowed");
  assert.equal((await rl.distinct(k("d"), "alice", { limit: 1, window: 60 })).status, "allowed");
  assert.equal((await rl.distinct(k("d"), "bob", { limit: 1, window: 60 })).status, "throttled");
  const th = await rl.throttle(k("cell"), { maxBurst: 1, count: 1, period: 60 });
  assert.deepEqual({ ...th, resetAfterS: 0 }, { allowed: true, limit: 2, remaining: 1, retryAfterS: null, resetAfterS: 0 });
  await rl.throttle(k("cell"), { maxBurst: 1, count: 1, period: 60 });
  const limited = await rl.throttle(k("cell"), { maxBurst: 1, count: 1, period: 60 });
  assert.equal(limited.allowed, false);
  assert.ok(limited.retryAfterS! >= 1 && limited.retryAfterS! <= 60);
  // leases: a lock of one
  const l1 = await rl.lease.acquire(k("lock"), { max: 1, ttl: 30, id: "req-1" });
  assert.deepEqual(l1, { granted: true, id: "req-1", inUse: 1, max: 1, retryAfterMs: 0 });
  const l2 = await rl.lease.acquire(k("lock"), { max: 1, ttl: 30 });
  assert.equal(l2.granted, false);
  assert.equal(l2.id, null);
  assert.ok(l2.retryAfterMs > 0 && l2.retryAfterMs <= 30_000);
  assert.equal((await rl.lease.list(k("lock")))[0]!.id, "req-1");
  assert.equal(await rl.lease.renew(k("lock"), "req-1", 60), true);
  assert.equal(await rl.lease.release(k("lock"), "req-1"), true);
  assert.equal(await rl.lease.release(k("lock"), "req-1"), false);
  const generated = await rl.lease.acquire(k("lock"), { max: 1, ttl: 30 });
  assert.ok(generated.granted && typeof generated.id === "string" && generated.id.length > 0);
}

test("bad options are refused before any round trip, naming the option", async () => {
  const rl = new RlCommands({ send: () => assert.fail("sent") });
  await assert.rejects(rl.take("k", { capacity: 0, tokens: 1, period: 1 }), /capacity must be/);
  await assert.rejects(rl.take("k", { capacity: 1, tokens: 1, period: 0.0001 }), /period must be seconds/);
  await assert.rejects(rl.take("k", { capacity: 1, tokens: 1, period: 1, box: [1, 2, 3] }), /box and offenses need strikes/);
  await assert.rejects(rl.take("k", { capacity: 1, tokens: 1, period: 1,
    strikes: { threshold: 1, window: 1, every: "yes" as unknown as boolean } }), /strikes.every must be a boolean/);
  await assert.rejects(rl.window("k", { limit: 1, window: 1, mode: "bogus" as "fixed" }), RlConfigError);
  await assert.rejects(rl.quota("k", { limit: 1, period: "year" as "day" }), /period must be "day"/);
  await assert.rejects(rl.take("k", { capacity: 1, tokens: 1, period: 1, also: [{ key: "", capacity: 1, tokens: 1, period: 1 }] }),
    /also\[0\]\.key/);
});

for (const { name, bin } of SERVERS) {
  describe(`typed commands on ${name}`, () => {
    let server: Server;
    let cluster: Server[];
    before(async () => {
      server = await Server.start(bin);
      cluster = await startCluster(bin);
    });
    after(async () => {
      await server.stop();
      for (const n of cluster) await n.stop();
    });

    test("node-redis client", async () => {
      const c = createClient({ url: `redis://127.0.0.1:${server.port}` });
      await c.connect();
      try {
        await exercise(forRedis(c), "nr");
      } finally {
        await c.close();
      }
    });

    test("ioredis client", async () => {
      const c = new Redis(server.port, "127.0.0.1");
      try {
        await exercise(forIoredis(c), "io");
      } finally {
        c.disconnect();
      }
    });

    test("node-redis cluster: each call goes to its slot's node", async () => {
      const c = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${cluster[0]!.port}` }], maxCommandRedirections: 0 });
      await c.connect();
      try {
        // "a" hashes to slot 15495 (second node), "b" to 3300 (first)
        await exercise(forRedis(c), "a");
        await exercise(forRedis(c), "b");
      } finally {
        await c.close();
      }
    });

    test("ioredis cluster: each call goes to its slot's node", async () => {
      const c = new Cluster([{ host: "127.0.0.1", port: cluster[0]!.port }], { maxRedirections: 0 });
      try {
        await exercise(forIoredis(c), "c");
        await exercise(forIoredis(c), "d");
      } finally {
        c.disconnect();
      }
    });
  });
}
