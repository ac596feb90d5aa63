/**
 * The stores inside their host libraries, on real servers: Express with
 * express-rate-limit and Fastify with @fastify/rate-limit, each on
 * redis-server and Valkey with the module, through node-redis and ioredis.
 * The host's contract as its documentation states it (hits and reset,
 * refusal with Retry-After, decrement for skipped requests, reset, read
 * without counting, per-route counters) and exactness under 50 concurrent
 * clients.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import express from "express";
import { MemoryStore, rateLimit, type Store } from "express-rate-limit";
import Fastify from "fastify";
import fastifyRateLimit from "@fastify/rate-limit";
import { Redis } from "ioredis";
import { createClient } from "redis";

import { forIoredis, forRedis, RlConfigError, RlExpressStore, rlFastifyStore, type RlCommands } from "../src/index.js";
import { avoidBoundary, count, hammer, keyOffsetMs, listening, untilStatus } from "./http.js";
import { redisForSuite, Server, SERVERS, sleep } from "./servers.js";

const CLIENTS = 50;

test("the stores refuse bad options at construction, naming them", () => {
  const rl = forIoredis(new Redis({ lazyConnect: true }));
  assert.throws(() => new RlExpressStore({ rl, mode: "rolling" as "fixed" }), /mode must be/);
  assert.throws(() => new RlExpressStore({ rl: {} as RlCommands }), /rl must be/);
  const store = new RlExpressStore({ rl });
  assert.throws(() => store.init({ limit: () => 5, windowMs: 1000 }), /limit must be a number with RlExpressStore, got a function/);
  assert.throws(() => new RlExpressStore({ rl, mode: "exact" }).init({ limit: 10_001, windowMs: 1000 }), /limit must be at most 10000 with mode "exact"/);
  assert.throws(() => store.init({ limit: 5, windowMs: 0.5 }), /windowMs must be/);
  const Store = rlFastifyStore({ rl });
  assert.throws(() => new Store({ ban: 2 }), /ban is not supported/);
  assert.throws(() => new Store({ continueExceeding: true }), RlConfigError);
  assert.throws(() => new (rlFastifyStore({ rl, mode: "exact" }))({ max: 20_000 }), /max must be at most 10000 with mode "exact"/);
});

for (const { name, bin } of SERVERS) {
  describe(`stores on ${name}`, () => {
    let server: Server;
    let ioredis: Redis;
    let nodeRedis: ReturnType<typeof createClient>;
    before(async () => {
      server = await Server.start(bin);
      ioredis = new Redis(server.port, "127.0.0.1");
      nodeRedis = createClient({ url: `redis://127.0.0.1:${server.port}` });
      await nodeRedis.connect();
    });
    after(async () => {
      ioredis.disconnect();
      await nodeRedis.close();
      await server.stop();
    });

    const clients = () => [["node-redis", forRedis(nodeRedis)], ["ioredis", forIoredis(ioredis)]] as const;

    test("express-rate-limit: contract and 50 concurrent clients", async () => {
      for (const [client, rl] of clients()) {
        for (const mode of ["fixed", "sliding"] as const) {
          const prefix = `erl:${client}:${mode}:`;
          const store = new RlExpressStore({ rl, mode, prefix });
          const app = express();
          app.use("/limited", rateLimit({ windowMs: 60_000, limit: 40, store, standardHeaders: "draft-7", legacyHeaders: false }));
          app.get("/limited", (_req, res) => { res.send("ok"); });
          const failing = new RlExpressStore({ rl, mode, prefix: `erl-skip:${client}:${mode}:` });
          app.use("/skip", rateLimit({ windowMs: 60_000, limit: 2, store: failing, skipFailedRequests: true }));
          app.get("/skip", (req, res) => { res.status(req.query["fail"] ? 500 : 200).send("x"); });
          const http = app.listen(0, "127.0.0.1");
          try {
            const url = await listening(http);
            // a fixed window's count restarts at the key's boundary: the burst must fall in one window
            const ips = ["::ffff:127.0.0.1", "127.0.0.1"];
            const skipKeys = ips.map((ip) => `erl-skip:${client}:${mode}:${ip}`);
            if (mode === "fixed") await avoidBoundary([...ips.map((ip) => prefix + ip), ...skipKeys], 60_000);
            const statuses = await hammer(`${url}/limited`, CLIENTS, 3);
            assert.equal(count(statuses, 200), 40, `${client} ${mode}: admitted`);
            assert.equal(count(statuses, 429), 110, `${client} ${mode}: refused`);
            const refused = await fetch(`${url}/limited`);
            assert.equal(refused.status, 429);
            const wait = Number(refused.headers.get("retry-after"));
            assert.ok(wait >= 1 && wait <= 120, `Retry-After ${wait}`);
            // the store's own view: 40 hits; a refused hit reads as one above the limit
            const ip = (await store.get(ips[0]!)) ? ips[0]! : ips[1]!;
            const info = await store.get(ip);
            assert.equal(info?.totalHits, 40);
            assert.ok(info!.resetTime!.getTime() > Date.now());
            if (mode === "fixed") {
              // the window ends at the key's boundary, as avoidBoundary computed it
              const now = Date.now();
              const end = now + 60_000 - ((now - keyOffsetMs(prefix + ip, 60_000)) % 60_000);
              assert.ok(Math.abs(info!.resetTime!.getTime() - end) < 1_000, `${client}: ends ${info!.resetTime!.toISOString()}, boundary ${new Date(end).toISOString()}`);
            }
            const over = await store.increment("127.0.0.1-probe");
            assert.equal(over.totalHits, 1);
            await store.decrement("127.0.0.1-probe");
            assert.equal(await store.get("127.0.0.1-probe"), undefined);
            await store.resetKey("::ffff:127.0.0.1");
            await store.resetKey("127.0.0.1");
            assert.equal((await fetch(`${url}/limited`)).status, 200, "admitted again after resetKey");
            // skipFailedRequests: a failed response's hit is given back (decrement)
            for (let i = 0; i < 3; i++) assert.equal((await fetch(`${url}/skip?fail=1`)).status, 500);
            assert.equal((await fetch(`${url}/skip`)).status, 200);
            assert.equal((await fetch(`${url}/skip`)).status, 200);
            assert.equal((await fetch(`${url}/skip`)).status, 429);
          } finally {
            http.close();
          }
        }
      }
    });

    test("@fastify/rate-limit: contract and 50 concurrent clients", async () => {
      for (const [client, rl] of clients()) {
        const app = Fastify();
        await app.register(fastifyRateLimit, { global: false, store: rlFastifyStore({ rl, mode: "sliding", prefix: `frl:${client}:` }) });
        app.get("/limited", { config: { rateLimit: { max: 40, timeWindow: 60_000 } } }, async () => "ok");
        app.get("/other", { config: { rateLimit: { max: 1, timeWindow: 60_000 } } }, async () => "ok");
        await app.listen({ port: 0, host: "127.0.0.1" });
        try {
          const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
          const statuses = await hammer(`${url}/limited`, CLIENTS, 3);
          assert.equal(count(statuses, 200), 40, `${client}: admitted`);
          assert.equal(count(statuses, 429), 110, `${client}: refused`);
          const refused = await fetch(`${url}/limited`);
          assert.equal(refused.status, 429);
          assert.equal(refused.headers.get("x-ratelimit-remaining"), "0");
          const wait = Number(refused.headers.get("retry-after"));
          assert.ok(wait >= 1 && wait <= 120, `Retry-After ${wait}`);
          // the store itself: incr counts, read does not, a refusal reads as one above max
          const store = new (rlFastifyStore({ rl, prefix: `frl-direct:${client}:` }))({});
          await avoidBoundary([`frl-direct:${client}:k`], 10_000, 2_000);
          const call = (m: "incr" | "read", max: number) => new Promise<{ current: number; ttl: number }>((res, rej) =>
            store[m]("k", (e, r) => (e ? rej(e) : res(r!)), 10_000, max));
          assert.equal((await call("incr", 2)).current, 1);
          assert.equal((await call("read", 2)).current, 1);
          assert.equal((await call("incr", 2)).current, 2);
          const full = await call("incr", 2);
          assert.equal(full.current, 3);
          assert.ok(full.ttl > 0 && full.ttl <= 10_000);
          assert.equal((await call("read", 2)).current, 2);
          // per-route counters: /other has its own
          assert.equal((await fetch(`${url}/other`)).status, 200);
          assert.equal((await fetch(`${url}/other`)).status, 429);
        } finally {
          await app.close();
        }
      }
    });
  });
}

describe("stores with Redis killed and back (node-redis: commands wait while it reconnects)", () => {
  let server: Server;
  let client: ReturnType<typeof createClient>;
  before(async () => {
    server = await Server.start(SERVERS[0]!.bin);
    client = createClient({ url: `redis://127.0.0.1:${server.port}`, socket: { reconnectStrategy: () => 100 } });
    client.on("error", () => {});
    await client.connect();
  });
  after(async () => {
    client.destroy();
    await server.stop();
  });

  test("express-rate-limit: passOnStoreError lets through, the default fails; both count again once back", async () => {
    const rl = forRedis(client);
    const app = express();
    const passStore = new RlExpressStore({ rl, prefix: "fail-pass:", timeoutMs: 300 });
    const limited = (pass: boolean, prefix: string) => rateLimit({ windowMs: 60_000, limit: 100, passOnStoreError: pass,
      store: pass ? passStore : new RlExpressStore({ rl, prefix, timeoutMs: 300 }) });
    app.get("/pass", limited(true, "fail-pass:"), (_req, res) => { res.send("ok"); });
    app.get("/fail", limited(false, "fail-strict:"), (_req, res) => { res.send("ok"); });
    const http = app.listen(0, "127.0.0.1");
    try {
      const url = await listening(http);
      assert.equal((await fetch(`${url}/fail`)).status, 200);
      await server.kill();
      assert.equal((await fetch(`${url}/pass`)).status, 200);
      assert.equal((await fetch(`${url}/fail`)).status, 500);
      assert.ok(await server.launch());
      assert.equal(await untilStatus(`${url}/fail`, 200), 200);
      assert.equal((await fetch(`${url}/pass`)).status, 200);
      // counted again (a call that timed out while Redis was away may count too, once it is sent)
      assert.ok(((await passStore.get("127.0.0.1"))?.totalHits ?? 0) >= 1);
    } finally {
      http.closeAllConnections();
      http.close();
    }
  });

  test("@fastify/rate-limit: skipOnError lets through, the default fails; both count again once back", async () => {
    const rl = forRedis(client);
    const app = Fastify();
    await app.register(fastifyRateLimit, { global: false, store: rlFastifyStore({ rl, prefix: "ffail:", timeoutMs: 300 }) });
    app.get("/skip", { config: { rateLimit: { max: 100, timeWindow: 60_000, skipOnError: true } } }, async () => "ok");
    app.get("/strict", { config: { rateLimit: { max: 100, timeWindow: 60_000, skipOnError: false } } }, async () => "ok");
    await app.listen({ port: 0, host: "127.0.0.1" });
    try {
      const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
      assert.equal((await fetch(`${url}/strict`)).status, 200);
      await server.kill();
      assert.equal((await fetch(`${url}/skip`)).status, 200);
      assert.equal((await fetch(`${url}/strict`)).status, 500);
      assert.ok(await server.launch());
      assert.equal(await untilStatus(`${url}/strict`, 200), 200);
      // counted again (a call that timed out while Redis was away may count too, once it is sent)
      const left = Number((await fetch(`${url}/skip`)).headers.get("x-ratelimit-remaining"));
      assert.ok(left >= 97 && left <= 99, `remaining ${left}`);
    } finally {
      await app.close();
    }
  });
});

describe("express-rate-limit's skip options: the same admitted requests as its MemoryStore", () => {
  const suite = redisForSuite();

  /** A store whose decrements the test can wait for (they run after a response, not awaited by it). */
  function tracked<S extends Store>(store: S): S & { settled(): Promise<void> } {
    const inflight = new Set<Promise<void>>();
    const decrement = store.decrement.bind(store);
    store.decrement = (key: string) => {
      const p = Promise.resolve(decrement(key)).finally(() => inflight.delete(p));
      inflight.add(p);
      return p;
    };
    return Object.assign(store, { settled: async () => { await sleep(20); await Promise.all([...inflight]); } });
  }

  /**
   * `steps` one after the other ("s" succeeds, "f" answers 500, "S" succeeds once the
   * gate opens, "o" opens it) on a route limited by `store`: the statuses.
   */
  async function run(store: Store & { settled(): Promise<void> }, skip: "skipFailedRequests" | "skipSuccessfulRequests",
    limit: number, steps: string): Promise<number[]> {
    let open!: () => void;
    const gate = new Promise<void>((r) => { open = r; });
    const app = express();
    app.use(rateLimit({ windowMs: 60_000, limit, store, [skip]: true, keyGenerator: () => "k", validate: false }));
    app.get("/", async (req, res) => {
      if (req.query["gate"]) await Promise.race([gate, sleep(10_000)]);
      res.status(req.query["fail"] ? 500 : 200).send("x");
    });
    const http = app.listen(0, "127.0.0.1");
    try {
      const url = await listening(http);
      const statuses: number[] = [];
      const held: Promise<number>[] = [];
      for (const step of steps) {
        if (step === "o") {
          open();
          statuses.push(...await Promise.all(held));
        } else if (step === "S") {
          held.push(fetch(`${url}/?gate=1`).then(async (r) => { await r.arrayBuffer(); return r.status; }));
          await sleep(100);
        } else {
          const r = await fetch(step === "f" ? `${url}/?fail=1` : url);
          await r.arrayBuffer();
          statuses.push(r.status);
        }
        await store.settled();
      }
      return statuses;
    } finally {
      open();
      http.closeAllConnections();
      http.close();
    }
  }

  const cases: ["skipFailedRequests" | "skipSuccessfulRequests", number, string][] = [
    ["skipFailedRequests", 5, "s".repeat(30)],
    ["skipFailedRequests", 3, "fsfsssfsssff"],
    ["skipSuccessfulRequests", 2, "ssfsfssfss"],
    // a refusal while a request that will succeed is in flight: its decrement must not free a place
    ["skipSuccessfulRequests", 1, "Sssoss"],
  ];
  cases.forEach(([skip, limit, steps], i) => {
    test(`${skip}, limit ${limit}: ${steps}`, async () => {
      const prefix = `erl-same:${i}:`;
      await avoidBoundary([`${prefix}k`], 60_000);
      const memory = await run(tracked(new MemoryStore()), skip, limit, steps);
      const rl = await run(tracked(new RlExpressStore({ rl: forIoredis(suite.redis()), prefix })), skip, limit, steps);
      assert.deepEqual(rl, memory);
    });
  });
});

describe("limits the host libraries accept: refused as they refuse, a configuration error never passes", () => {
  const suite = redisForSuite();
  const statuses = async (url: string, n: number) => {
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      const r = await fetch(url);
      await r.arrayBuffer();
      out.push(r.status);
    }
    return out;
  };

  test("express-rate-limit: limit 0, 2.5, a function, exact above 10,000 (with and without passOnStoreError)", async () => {
    const rl = forIoredis(suite.redis());
    const app = express();
    const logged: unknown[] = [];
    const logger = { error: (e: unknown) => { logged.push(e); }, warn: () => {} };
    let n = 0;
    const limited = (limit: unknown, pass: boolean, mode: "fixed" | "exact" = "fixed") => rateLimit({
      windowMs: 60_000, limit: limit as number, passOnStoreError: pass, validate: false, logger,
      store: new RlExpressStore({ rl, mode, prefix: `erl-odd:${++n}:` }),
    } as never);
    for (const pass of [false, true]) {
      app.get(`/zero/${pass}`, limited(0, pass), (_req, res) => { res.send("ok"); });
      app.get(`/half/${pass}`, limited(2.5, pass), (_req, res) => { res.send("ok"); });
      app.get(`/fn/${pass}`, limited(() => 2, pass), (_req, res) => { res.send("ok"); });
      app.get(`/exact/${pass}`, limited(20_000, pass, "exact"), (_req, res) => { res.send("ok"); });
    }
    const http = app.listen(0, "127.0.0.1");
    try {
      const url = await listening(http);
      await avoidBoundary([2, 6].map((i) => `erl-odd:${i}:127.0.0.1`).concat([2, 6].map((i) => `erl-odd:${i}:::ffff:127.0.0.1`)), 60_000);
      for (const pass of [false, true]) {
        assert.deepEqual(await statuses(`${url}/zero/${pass}`, 3), [429, 429, 429], `limit 0, passOnStoreError ${pass}`);
        assert.deepEqual(await statuses(`${url}/half/${pass}`, 4), [200, 200, 429, 429], `limit 2.5, passOnStoreError ${pass}`);
        assert.deepEqual(await statuses(`${url}/fn/${pass}`, 2), [429, 429], `a limit function, passOnStoreError ${pass}`);
        assert.deepEqual(await statuses(`${url}/exact/${pass}`, 2), [429, 429], `exact above 10,000, passOnStoreError ${pass}`);
      }
      assert.ok(logged.some((e) => /limit must be at most 10000 with mode "exact"/.test(String(e))), "init's error is logged");
    } finally {
      http.closeAllConnections();
      http.close();
    }
  });

  test("@fastify/rate-limit: max 0, a max function giving 0 or 2.5, exact above 10,000 (with skipOnError)", async () => {
    const rl = forIoredis(suite.redis());
    const app = Fastify();
    await app.register(fastifyRateLimit, { global: false, skipOnError: true, store: rlFastifyStore({ rl, prefix: "frl-odd:" }) });
    const route = (path: string, max: unknown) => app.get(path, { config: { rateLimit: { max: max as number, timeWindow: 60_000 } } }, async () => "ok");
    route("/zero", 0);
    route("/fn-zero", () => 0);
    route("/fn-half", () => 2.5);
    await app.register(async (exact) => {
      await exact.register(fastifyRateLimit, { global: false, skipOnError: true, store: rlFastifyStore({ rl, mode: "exact", prefix: "frl-odd-exact:" }) });
      exact.get("/exact-fn", { config: { rateLimit: { max: () => 20_000, timeWindow: 60_000 } } }, async () => "ok");
    });
    const warnings: Error[] = [];
    const onWarning = (w: Error) => { warnings.push(w); };
    process.on("warning", onWarning);
    await app.listen({ port: 0, host: "127.0.0.1" });
    try {
      const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
      assert.deepEqual(await statuses(`${url}/zero`, 3), [429, 429, 429], "max 0");
      assert.deepEqual(await statuses(`${url}/fn-zero`, 3), [429, 429, 429], "max () => 0");
      assert.deepEqual(await statuses(`${url}/fn-half`, 4), [200, 200, 429, 429], "max () => 2.5");
      assert.deepEqual(await statuses(`${url}/exact-fn`, 2), [429, 429], "exact, max () => 20000");
      await sleep(50);
      assert.ok(warnings.some((w) => /max must be at most 10000 with mode "exact"/.test(w.message)), "the error is said");
    } finally {
      process.off("warning", onWarning);
      await app.close();
    }
    const bad = Fastify();
    await assert.rejects(async () => {
      await bad.register(fastifyRateLimit, { max: 20_000, store: rlFastifyStore({ rl, mode: "exact" }) });
      await bad.ready();
    }, /max must be at most 10000 with mode "exact"/);
  });
});
