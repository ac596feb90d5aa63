// An Express API limited by rl (the payments ledger's application layer):
//   node examples/express.mjs        (REDIS_URL, default redis://127.0.0.1:6379; PORT, default 3000)
// Callers name themselves with X-Tenant and X-Api-Key (stand-ins for your authentication).
import express from "express";
import { createClient } from "redis";

import { forRedis, rlExpress } from "@rl/server";

const redis = createClient({ url: process.env.REDIS_URL ?? "redis://127.0.0.1:6379" });
redis.on("error", (err) => console.error("redis:", err.message));
await redis.connect();

const tenant = (req) => req.get("x-tenant");
const apiKey = (req) => req.get("x-api-key");
const limits = rlExpress({ rl: forRedis(redis), timeoutMs: 100 });

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

const app = express();
app.use(express.json());

// a caller without a tenant or an API key is refused here: a rule whose key function
// returns undefined does not apply to the request, so it would not be limited at all
app.use("/v1", (req, res, next) => {
  if (tenant(req) && apiKey(req)) return next();
  res.status(401).json({ error: "X-Tenant and X-Api-Key are required" });
});

app.get("/v1/ledgers/:id", limits.route({ rules: [apiBudget(1)] }), (req, res) => {
  res.json({ ledger: req.params.id });
});

// a write costs 10 points, or 25 above 10,000 cents; it needs an Idempotency-Key
app.post("/v1/ledgers/:id/entries", limits.route({
  idempotencyKey: true,
  rules: [apiBudget((req) => (Number(req.body?.amount ?? 0) > 10_000 ? 25 : 10))],
}), (req, res) => {
  res.status(201).json({ ledger: req.params.id, amount: req.body?.amount ?? 0 });
});

// one reconciliation per ledger at a time (409, never queued), two per tenant
app.post("/v1/ledgers/:id/reconcile", limits.route({
  idempotencyKey: true,
  locks: [{ name: "reconcile-ledger", key: (req) => req.params.id, ttl: 300, expected: 5 }],
  rules: [{ name: "reconcile-tenant", key: tenant, limiter: { kind: "lease", max: 2, ttl: 300, expected: 5 } }],
}), async (req, res) => {
  await new Promise((r) => setTimeout(r, Number(req.query.ms ?? 200)));
  res.json({ ledger: req.params.id, reconciled: true });
});

// 1000 exports a day per tenant (403 with an upgrade link); with Redis away, let them through
app.get("/v1/exports", limits.route({
  onRedisFailure: "open",
  rules: [{ name: "exports-daily", key: tenant, limiter: { kind: "quota", limit: 1000, period: "DAY" },
    onRefusal: { upgradeUrl: "https://example.com/pricing" } }],
}), (_req, res) => {
  res.json({ export: "started" });
});

const server = app.listen(Number(process.env.PORT ?? 3000), "127.0.0.1", () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
