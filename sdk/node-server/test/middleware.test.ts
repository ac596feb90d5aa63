/**
 * The middleware's features at their boundaries, on Express and Fastify,
 * on redis-server and Valkey with the module, over real HTTP: 50
 * concurrent clients never admitted beyond the limit, costs from the
 * request, several buckets all-or-nothing, leases held for the request
 * and released after it and on client disconnect, per-resource locks (409,
 * never queued), shadow mode, Redis slow and killed then back under each
 * failure setting, bad configuration refused at start.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import express from "express";
import Fastify from "fastify";
import { Redis } from "ioredis";
import { createClient } from "redis";

import { forIoredis, forRedis, rlExpress, rlFastify, ruleKey, type DecisionEvent, type RlCommands } from "../src/index.js";
import { FRAMEWORKS, serve, type AnyReq, type App, type RouteDef } from "./apps.js";
import { count, hammer, listening, untilStatus } from "./http.js";
import { raw, redisForSuite, Server, SERVERS, sleep } from "./servers.js";

const CLIENTS = 50;

const header = (name: string) => (req: AnyReq) => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};
const param = (name: string) => (req: AnyReq) => req.params[name];

const ROUTES: RouteDef[] = [
  { method: "GET", path: "/crowd", limits: { rules: [{ name: "crowd", limiter: { kind: "bucket", rate: 1, burst: 30, period: 3600 } }] } },
  { method: "GET", path: "/crowd-window", limits: { rules: [{ name: "crowd-window", limiter: { kind: "window", limit: 25, window: 3600, mode: "sliding" } }] } },
  { method: "POST", path: "/cost", limits: { rules: [{ name: "cost", cost: (req) => Number(header("x-cost")(req) ?? 1),
      limiter: { kind: "bucket", rate: 1, burst: 10, period: 3600 } }] } },
  { method: "GET", path: "/multi", limits: { rules: [{ name: "multi-key", key: header("x-tenant"), scope: header("x-key"),
      limiter: { kind: "bucket", rate: 1, burst: 3, period: 3600,
        also: [{ name: "multi-tenant", rate: 1, burst: 4, period: 3600 }] } }] } },
  { method: "GET", path: "/quota", limits: { rules: [
      { name: "quota-window", limiter: { kind: "window", limit: 5, window: 60, mode: "exact" } },
      { name: "quota-day", limiter: { kind: "quota", limit: 2, period: "DAY" }, onRefusal: { upgradeUrl: "https://example.com/up" } }] } },
  { method: "GET", path: "/box", limits: { rules: [{ name: "box", limiter: { kind: "window", limit: 1, window: 60, mode: "exact",
      strikes: { threshold: 2, window: 60 }, box: [30, 60, 120] } }] } },
  { method: "GET", path: "/pool", limits: { rules: [{ name: "pool", limiter: { kind: "lease", max: 2, ttl: 30 } }] } },
  { method: "POST", path: "/ledgers/:id/reconcile", limits: { locks: [{ name: "ledger", key: param("id"), ttl: 30 }] } },
  { method: "GET", path: "/shadow", limits: { shadow: true, rules: [{ name: "shadow", limiter: { kind: "bucket", rate: 1, burst: 1, period: 3600 } }] } },
  { method: "GET", path: "/closed", limits: { timeoutMs: 1000, rules: [{ name: "closed", limiter: { kind: "bucket", rate: 100, burst: 100, period: 60 } }] } },
  { method: "GET", path: "/local", limits: { timeoutMs: 1000, onRedisFailure: "local", rules: [{ name: "local", limiter: { kind: "bucket", rate: 8, burst: 8, period: 3600 } }] } },
  { method: "GET", path: "/open", limits: { timeoutMs: 1000, rules: [{ name: "open", onRedisFailure: "open", limiter: { kind: "bucket", rate: 1, burst: 1, period: 3600 } }] } },
];

/** The client a suite uses: rl's commands over it, and how to close it. */
async function connect(client: "ioredis" | "node-redis", port: number): Promise<{ rl: RlCommands; close(): Promise<void> }> {
  if (client === "ioredis") {
    const redis = new Redis(port, "127.0.0.1", { maxRetriesPerRequest: 1, retryStrategy: () => 100 });
    redis.on("error", () => {});
    return { rl: forIoredis(redis), close: async () => redis.disconnect() };
  }
  const redis = createClient({ url: `redis://127.0.0.1:${port}`, socket: { reconnectStrategy: () => 100 } });
  redis.on("error", () => {});
  await redis.connect();
  return { rl: forRedis(redis), close: async () => { redis.destroy(); } };
}

// every framework on each server through ioredis, and on redis-server through node-redis too
const SUITES = [...SERVERS.map((s) => ({ ...s, client: "ioredis" as const })), { ...SERVERS[0]!, client: "node-redis" as const }];

for (const { name, bin, client } of SUITES) {
  for (const framework of FRAMEWORKS) {
    describe(`${framework} middleware on ${name} through ${client}`, () => {
      let server: Server;
      let conn: { rl: RlCommands; close(): Promise<void> };
      let rl: RlCommands;
      let app: App;
      const events: DecisionEvent[] = [];
      before(async () => {
        server = await Server.start(bin);
        conn = await connect(client, server.port);
        rl = conn.rl;
        // a generous budget: a loaded machine must not fail a route closed by accident
        app = await serve(framework, { rl, timeoutMs: 15_000, onDecision: (e) => events.push(e) }, ROUTES);
      });
      after(async () => {
        await app.close();
        await conn.close();
        await server.stop();
      });

      test("50 concurrent clients are never admitted beyond the limit (bucket and window)", async () => {
        const statuses = await hammer(`${app.url}/crowd`, CLIENTS, 2);
        assert.equal(count(statuses, 200), 30);
        assert.equal(count(statuses, 429), 70);
        const w = await hammer(`${app.url}/crowd-window`, CLIENTS, 1);
        assert.equal(count(w, 200), 25);
        assert.equal(count(w, 429), 25);
      });

      test("a cost from the request; a cost above the capacity never fits", async () => {
        const post = (cost: number) => fetch(`${app.url}/cost`, { method: "POST", headers: { "X-Cost": String(cost) } });
        let r = await post(4);
        assert.equal(r.status, 200);
        assert.equal(r.headers.get("ratelimit-policy"), '"cost";q=1;qu="points";w=3600');
        assert.match(r.headers.get("ratelimit")!, /^"cost";r=6;t=\d+$/);
        assert.equal((await post(4)).status, 200);
        r = await post(4);
        assert.equal(r.status, 429);
        assert.match(r.headers.get("ratelimit")!, /^"cost";r=2;/);
        assert.equal((await post(2)).status, 200);
        r = await post(11);
        assert.equal(r.status, 429);
        assert.equal(r.headers.get("retry-after"), null);
        assert.match(((await r.json()) as { detail: string }).detail, /it never fits/);
      });

      test("several buckets at once, all or nothing", async () => {
        const get = (key: string) => fetch(`${app.url}/multi`, { headers: { "X-Tenant": "t1", "X-Key": key } });
        for (let i = 0; i < 3; i++) assert.equal((await get("a")).status, 200);
        let r = await get("a");
        assert.equal(r.status, 429);
        assert.match(r.headers.get("ratelimit")!, /^"multi-key";r=0/);
        r = await get("b");
        assert.equal(r.status, 200);
        r = await get("b");
        assert.equal(r.status, 429);
        assert.match(r.headers.get("ratelimit")!, /^"multi-tenant";r=0/);
        // the refused call took nothing from b's own bucket
        const probe = await rl.take(ruleKey("rl", "t1", "multi-key", "b"), { capacity: 3, tokens: 1, period: 3600, cost: 0 });
        assert.equal(probe.remaining, 2);
      });

      test("a window and a daily quota on one route: the quota answers 403, the window's charge is given back", async () => {
        assert.equal((await fetch(`${app.url}/quota`)).status, 200);
        assert.equal((await fetch(`${app.url}/quota`)).status, 200);
        const r = await fetch(`${app.url}/quota`);
        assert.equal(r.status, 403);
        const body = await r.json() as Record<string, unknown>;
        assert.equal(body["type"], "https://api.example.com/problems/quota-exceeded");
        assert.equal(body["upgrade_url"], "https://example.com/up");
        // the refund follows the refusal (not awaited by it)
        let remaining = 0;
        for (let i = 0; i < 100 && remaining !== 3; i++) {
          remaining = (await rl.window(ruleKey("rl", "127.0.0.1", "quota-window"), { limit: 5, window: 60, mode: "exact", cost: 0 })).remaining;
          if (remaining !== 3) await sleep(50);
        }
        assert.equal(remaining, 3, "the refused request's window point came back");
      });

      test("early retries box the caller", async () => {
        assert.equal((await fetch(`${app.url}/box`)).status, 200);
        const first = await fetch(`${app.url}/box`);
        assert.equal(first.status, 429);
        assert.equal(first.headers.get("x-penalty-box-status"), null, "the first refusal is no strike");
        const warned = await fetch(`${app.url}/box`);
        assert.equal(warned.headers.get("x-penalty-box-status"), "Warning");
        const boxed = await fetch(`${app.url}/box`);
        assert.equal(boxed.status, 429);
        assert.equal(boxed.headers.get("x-penalty-box-status"), "Active-Lockout");
        const b = await boxed.json() as Record<string, unknown>;
        assert.equal(b["penalty_level"], 1);
        assert.equal(boxed.headers.get("retry-after"), "30");
      });

      test("a concurrency lease is held for the request and released after it", async () => {
        const slow = [fetch(`${app.url}/pool?gate=pool`), fetch(`${app.url}/pool?gate=pool`)];
        for (let i = 0; i < 100 && (app.gates.entered.get("pool") ?? 0) < 2; i++) await sleep(20);
        const r = await fetch(`${app.url}/pool`);
        assert.equal(r.status, 429);
        assert.equal((await r.json() as Record<string, unknown>)["type"], "https://api.example.com/problems/concurrency-limit-exceeded");
        app.gates.open("pool");
        for (const s of await Promise.all(slow)) assert.equal(s.status, 200);
        let live = 2;
        for (let i = 0; i < 100 && live > 0; i++) {
          live = (await rl.lease.list(ruleKey("rl", "127.0.0.1", "pool"))).length;
          if (live > 0) await sleep(50);
        }
        assert.equal(live, 0, "released once the responses ended");
        assert.equal((await fetch(`${app.url}/pool`)).status, 200);
      });

      test("a per-resource lock: 409 with Retry-After at once (never queued), released on client disconnect", async () => {
        const ctl = new AbortController();
        const held = fetch(`${app.url}/ledgers/L1/reconcile?gate=L1`, { method: "POST", signal: ctl.signal }).catch((e: Error) => e);
        for (let i = 0; i < 100 && !app.gates.entered.get("L1"); i++) await sleep(20);
        let holderDone = false;
        void held.then(() => { holderDone = true; });
        const r = await fetch(`${app.url}/ledgers/L1/reconcile`, { method: "POST" });
        assert.equal(r.status, 409);
        assert.equal(holderDone, false, "answered while the holder still runs: not queued behind it");
        assert.equal(r.headers.get("retry-after"), "1");
        assert.equal((await fetch(`${app.url}/ledgers/L2/reconcile`, { method: "POST" })).status, 200, "another ledger");
        ctl.abort();
        assert.ok((await held) instanceof Error);
        const key = ruleKey("rl", "L1", "ledger");
        let left = 1;
        for (let i = 0; i < 100 && left > 0; i++) {
          left = (await rl.lease.list(key)).length;
          if (left > 0) await sleep(20);
        }
        assert.equal(left, 0, "the lease went with the client, while the handler still waits");
        assert.equal((await fetch(`${app.url}/ledgers/L1/reconcile`, { method: "POST" })).status, 200);
        app.gates.open("L1");
      });

      test("shadow mode decides and reports, but never refuses nor adds fields", async () => {
        events.length = 0;
        assert.equal((await fetch(`${app.url}/shadow`)).status, 200);
        const r = await fetch(`${app.url}/shadow`);
        assert.equal(r.status, 200);
        assert.equal(r.headers.get("ratelimit"), null);
        assert.ok(events.some((e) => e.decision === "shadow_refused" && e.policy === "shadow"));
      });

      test("Redis slow, then killed and back: closed 503, local limiter marked degraded, open", async () => {
        // slow: every client paused for 5 s (beyond the routes' 1 s)
        await raw(server.port, "CLIENT", "PAUSE", 5000, "ALL");
        const slow = await fetch(`${app.url}/closed`);
        assert.equal(slow.status, 503);
        assert.equal(slow.headers.get("retry-after"), "15");
        assert.equal(await untilStatus(`${app.url}/closed`), 200, "Redis answers again");
        await server.kill();
        const closed = await fetch(`${app.url}/closed`);
        assert.equal(closed.status, 503);
        assert.equal((await closed.json() as Record<string, unknown>)["type"], "https://api.example.com/problems/rate-limiter-unavailable");
        // local: a quarter of the 8-point bucket (2), marked degraded
        const local = [await fetch(`${app.url}/local`), await fetch(`${app.url}/local`), await fetch(`${app.url}/local`)];
        assert.deepEqual(local.map((x) => x.status), [200, 200, 429]);
        for (const x of local) assert.equal(x.headers.get("x-ratelimit-degraded"), "fallback");
        assert.match(local[2]!.headers.get("ratelimit")!, /^"local-degraded";r=0/);
        assert.equal((await local[2]!.json() as Record<string, unknown>)["degraded"], "fallback");
        const open = await fetch(`${app.url}/open`);
        assert.equal(open.status, 200);
        assert.equal(open.headers.get("ratelimit"), null);
        // back on the same port: decided by Redis again
        assert.ok(await server.launch());
        assert.equal(await untilStatus(`${app.url}/closed`), 200);
        let degraded: string | null = "fallback";
        for (let i = 0; i < 100 && degraded !== null; i++) {
          const l = await fetch(`${app.url}/local`);
          degraded = l.headers.get("x-ratelimit-degraded");
          if (degraded !== null) await sleep(100);
        }
        assert.equal(degraded, null);
      });
    });
  }
}

describe("bad configuration is refused at start, naming the option", () => {
  const rl = forIoredis(new Redis({ lazyConnect: true }));
  const bad: [string, RouteDef["limits"], RegExp][] = [
    ["rate 0", { rules: [{ name: "x", limiter: { kind: "bucket", rate: 0, burst: 1 } }] }, /rules\[0\] \(x\): limiter\.rate must be/],
    ["unknown kind", { rules: [{ name: "x", limiter: { kind: "leaky" } as never }] }, /limiter\.kind must be/],
    ["window decimals", { rules: [{ name: "x", limiter: { kind: "window", limit: 1, window: 0.0001 } }] }, /limiter\.window must be seconds/],
    ["strikes.every", { rules: [{ name: "x", limiter: { kind: "bucket", rate: 1, burst: 1, strikes: { threshold: 1, window: 1, every: 1 as never } } }] }, /limiter\.strikes must be \{threshold: integer >= 1, window: seconds, every\?: boolean\}/],
    ["box without strikes", { rules: [{ name: "x", limiter: { kind: "bucket", rate: 1, burst: 1, box: [1, 2, 3] } }] }, /limiter\.box needs limiter\.strikes/],
    ["also period", { rules: [{ name: "x", limiter: { kind: "bucket", rate: 1, burst: 1, also: [{ name: "t", rate: 1, burst: 1, period: 0 }] } }] }, /rules\[0\] \(x\): limiter\.also\[0\]\.period must be/],
    ["lock without key", { locks: [{ name: "l" } as never] }, /locks\[0\]: key must be a function/],
    ["failure mode", { onRedisFailure: "maybe" as never, rules: [] }, /onRedisFailure must be/],
    ["status", { rules: [{ name: "x", limiter: { kind: "lease", max: 1 }, onRefusal: { status: 200 } }] }, /onRefusal\.status must be/],
    ["header value", { rules: [{ name: "x", limiter: { kind: "lease", max: 1 }, onRefusal: { headers: { "X-Plan": "gratuit ✓" } } }] },
      /rules\[0\] \(x\): onRefusal\.headers\["X-Plan"\] must be a string usable in a header value/],
    ["header name", { rules: [{ name: "x", limiter: { kind: "lease", max: 1 }, onRefusal: { headers: { "X Plan": "free" } } }] },
      /rules\[0\] \(x\): onRefusal\.headers: "X Plan" is not a valid header name/],
    ["rule name in a header", { rules: [{ name: "café ✓", limiter: { kind: "lease", max: 1 } }] }, /name must be usable in a header value/],
    ["exact above 10,000", { rules: [{ name: "x", limiter: { kind: "window", limit: 10_001, window: 60, mode: "exact" } }] },
      /rules\[0\] \(x\): limiter\.limit must be at most 10000 with mode exact/],
    ["exact also above 10,000", { rules: [{ name: "x", limiter: { kind: "window", limit: 5, window: 60, mode: "exact", also: [{ name: "t", limit: 20_000 }] } }] },
      /limiter\.also\[0\]\.limit must be at most 10000 with mode exact/],
    ["duplicate", { rules: [{ name: "x", limiter: { kind: "lease", max: 1 } }, { name: "x", limiter: { kind: "lease", max: 1 } }] }, /name x is used twice/],
  ];
  for (const framework of FRAMEWORKS) {
    for (const [what, limits, message] of bad) {
      test(`${framework}: ${what}`, async () => {
        await assert.rejects(serve(framework, { rl }, [{ method: "GET", path: "/x", limits }]), message);
      });
    }
    test(`${framework}: limiter options`, async () => {
      await assert.rejects(serve(framework, { rl, timeoutMs: -1 }, []), /timeoutMs must be/);
      await assert.rejects(serve(framework, { rl, fallbackRatio: 2 }, []), /fallbackRatio must be/);
      await assert.rejects(serve(framework, {} as never, []), /rl must be/);
    });
  }
});

describe("Express: an error while writing the verdict goes to the app's error handler", () => {
  const suite = redisForSuite();

  test("headers already sent by an earlier middleware: next(error) once, no unhandled rejection", async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (e: unknown) => { unhandled.push(e); };
    process.on("unhandledRejection", onUnhandled);
    const errors: Error[] = [];
    const app = express();
    const limits = rlExpress({ rl: forIoredis(suite.redis()) });
    // a middleware that sends the head early (the rate-limit fields can no longer be set)
    app.use((_req, res, next) => { res.writeHead(200); next(); });
    app.get("/early", limits.route({ rules: [{ name: "early", limiter: { kind: "bucket", rate: 1, burst: 5, period: 3600 } }] }),
      (_req, res) => { res.end("handler"); });
    app.use((err: Error, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
      errors.push(err);
      res.end();
    });
    const http = app.listen(0, "127.0.0.1");
    try {
      const url = await listening(http);
      const r = await fetch(`${url}/early`);
      assert.equal(await r.text(), "", "the handler did not run");
      await sleep(100);
      assert.deepEqual(unhandled, []);
      assert.equal(errors.length, 1);
      assert.equal((errors[0] as { code?: string }).code, "ERR_HTTP_HEADERS_SENT");
    } finally {
      process.off("unhandledRejection", onUnhandled);
      http.closeAllConnections();
      http.close();
    }
  });
});

describe("the Fastify plugin's hook option", () => {
  const suite = redisForSuite();

  test("onRequest decides before the body is read; a bad hook is refused at registration", async () => {
    const app = Fastify();
    await app.register(rlFastify, { rl: forIoredis(suite.redis()), hook: "onRequest" });
    app.post("/early", { config: { rl: { rules: [{ name: "early", limiter: { kind: "bucket", rate: 1, burst: 1, period: 3600 } }] } } },
      async () => "ok");
    await app.listen({ port: 0, host: "127.0.0.1" });
    try {
      const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}/early`;
      assert.equal((await fetch(url, { method: "POST", body: "{}", headers: { "Content-Type": "application/json" } })).status, 200);
      assert.equal((await fetch(url, { method: "POST", body: "{}", headers: { "Content-Type": "application/json" } })).status, 429);
    } finally {
      await app.close();
    }
    const bad = Fastify();
    await assert.rejects(async () => {
      await bad.register(rlFastify, { rl: forIoredis(suite.redis()), hook: "onSend" as never });
      await bad.ready();
    }, /hook must be onRequest or preHandler/);
  });
});
