// A Fastify API limited by rl (the payments ledger's application layer):
//   node examples/fastify.mjs        (REDIS_URL, default redis://127.0.0.1:6379; PORT, default 3000)
// Callers name themselves with X-Tenant and X-Api-Key (stand-ins for your authentication).
import Fastify from "fastify";
import { Redis } from "ioredis";

import { forIoredis, rlFastify } from "@rl/server";

const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379", { maxRetriesPerRequest: 1 });
redis.on("error", (err) => console.error("redis:", err.message));

const tenant = (req) => req.headers["x-tenant"];
const apiKey = (req) => req.headers["x-api-key"];

// per API key 100 points a minute, per tenant 300, charged together (all or nothing);
// early retries after a refusal box the key (5 min, 1 h, 1 day)
const apiBudget = (cost) => ({
  name: "key", key: tenant, scope: apiKey, cost, unit: "points",
  limiter: {
    kind: "bucket", rate: 100, burst: 100, period: 60,
    also: [{ name: "tenant", rate: 300, burst: 300, period: 60 }],
    strikes: { threshold: 20, window: 60 }, box: [300, 3600, 86400],
  },
});

const app = Fastify();
await app.register(rlFastify, { rl: forIoredis(redis), timeoutMs: 100 });

// a caller without a tenant or an API key is refused here: a rule whose key function
// returns undefined does not apply to the request, so it would not be limited at all
app.addHook("onRequest", async (req, reply) => {
  if (!tenant(req) || !apiKey(req)) return reply.code(401).send({ error: "X-Tenant and X-Api-Key are required" });
});

app.get("/v1/ledgers/:id", { config: { rl: { rules: [apiBudget(1)] } } }, async (req) => ({ ledger: req.params.id }));

// a write costs 10 points, or 25 above 10,000 cents; it needs an Idempotency-Key
app.post("/v1/ledgers/:id/entries", {
  config: { rl: { idempotencyKey: true, rules: [apiBudget((req) => (Number(req.body?.amount ?? 0) > 10_000 ? 25 : 10))] } },
}, async (req, reply) => {
  reply.code(201);
  return { ledger: req.params.id, amount: req.body?.amount ?? 0 };
});

// one reconciliation per ledger at a time (409, never queued), two per tenant
app.post("/v1/ledgers/:id/reconcile", {
  config: { rl: {
    idempotencyKey: true,
    locks: [{ name: "reconcile-ledger", key: (req) => req.params.id, ttl: 300, expected: 5 }],
    rules: [{ name: "reconcile-tenant", key: tenant, limiter: { kind: "lease", max: 2, ttl: 300, expected: 5 } }],
  } },
}, async (req) => {
  await new Promise((r) => setTimeout(r, Number(req.query.ms ?? 200)));
  return { ledger: req.params.id, reconciled: true };
});

// 1000 exports a day per tenant (403 with an upgrade link); with Redis away, let them through
app.get("/v1/exports", {
  config: { rl: { onRedisFailure: "open", rules: [{ name: "exports-daily", key: tenant,
    limiter: { kind: "quota", limit: 1000, period: "DAY" }, onRefusal: { upgradeUrl: "https://example.com/pricing" } }] } },
}, async () => ({ export: "started" }));

const address = await app.listen({ port: Number(process.env.PORT ?? 3000), host: "127.0.0.1" });
console.log(`listening on ${address}`);
