/**
 * sdk/responses.json through the middleware over real HTTP: Express and
 * Fastify serving one route per case with the case's rules, on
 * redis-server with the module, each path driven to the case's reply as
 * the gateway test drives the gateway (requests before it, a request
 * holding a lease, a box tripped by hand); then the cases without a
 * gateway: the Idempotency-Key requirement, and Redis killed under a
 * route that fails closed.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Redis } from "ioredis";

import { forIoredis, ruleKey } from "../src/index.js";
import { FRAMEWORKS, serve, type App, type RouteDef } from "./apps.js";
import { raw, Server, SERVERS, until } from "./servers.js";
import { differences, ruleConfig, VECTORS, type Vector } from "./vectors.js";

function routeOf(v: Vector): RouteDef {
  const rules = v.rules.map((r) => ({ ...ruleConfig(r), ...(r.on_redis_failure ? { onRedisFailure: r.on_redis_failure as "closed" } : {}) }));
  return { method: "GET", path: v.request.path, limits: { rules: rules as never, idempotencyKey: "idempotency_key" in v } };
}

async function check(app: App, v: Vector, startMs = Date.now()): Promise<void> {
  const url = app.url + v.request.path;
  const sent = Date.now();
  const resp = await fetch(url);
  const seen = Date.now();
  const text = await resp.text();
  const body = v.expect.body ? JSON.parse(text) as Record<string, unknown> : undefined;
  if (body) assert.match(String(body["request_id"]), /^[0-9a-f]{32}$/);
  const diff = differences(v, resp.status, Object.fromEntries([...resp.headers.entries()]), body,
    { startMs, sentMs: sent, seenMs: seen }, ["request_id"]);
  assert.deepEqual(diff, [], `${v.name}: ${v.about}`);
}

const server0 = SERVERS[0]!;
for (const framework of FRAMEWORKS) {
  describe(`${framework} answers as sdk/responses.json says`, () => {
    let server: Server;
    let redis: Redis;
    let app: App;
    before(async () => {
      server = await Server.start(server0.bin);
      redis = new Redis(server.port, "127.0.0.1", { maxRetriesPerRequest: 1 });
      redis.on("error", () => {});
      app = await serve(framework, { rl: forIoredis(redis), timeoutMs: 1000 }, VECTORS.cases.map(routeOf));
    });
    after(async () => {
      await app.close();
      redis.disconnect();
      await server.stop();
    });

    for (const v of VECTORS.cases.filter((c) => c.gateway !== null)) {
      test(v.name, async () => {
        const g = v.gateway!;
        const startMs = Date.now();
        const url = app.url + v.request.path;
        if (g.trip) await raw(server.port, "RL.BOX", "TRIP", ruleKey("rl", "127.0.0.1", v.rules[0]!.name), g.trip.level, g.trip.duration);
        for (let i = 0; i < (g.before ?? 0); i++) await (await fetch(url)).arrayBuffer();
        // the holder's handler waits on a gate (at most 10 s) until the case is checked
        const holder = g.hold ? fetch(`${url}?gate=${v.name}`) : undefined;
        try {
          if (holder) {
            // entered: its lease taken (polled, not a fixed sleep)
            assert.ok(await until(() => Boolean(app.gates.entered.get(v.name))), `${v.name}: the holder never got its lease`);
          }
          await check(app, v, startMs);
        } finally {
          app.gates.open(v.name);
        }
        const held = await holder;
        await held?.arrayBuffer();
        if (held) assert.equal(held.status, 200, "the holder");
      });
    }

    test("idempotency-key-required", async () => {
      const v = VECTORS.cases.find((c) => c.name === "idempotency-key-required")!;
      await check(app, v);
      assert.equal((await fetch(app.url + v.request.path, { headers: { "Idempotency-Key": "op-1" } })).status, 200);
    });

    test("fail-closed (Redis killed)", async () => {
      const v = VECTORS.cases.find((c) => c.name === "fail-closed")!;
      await server.kill();
      await check(app, v);
    });
  });
}
