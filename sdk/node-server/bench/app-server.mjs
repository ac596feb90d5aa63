// One Express server of the application benchmark (bench/app.mjs starts
// one per variant): `node bench/app-server.mjs <variant> <redis port>`,
// prints its URL. The same route, GET /bench, limited per client IP to
// 1e9 requests a minute (never refused: every request is a decision):
//   rate-limit-redis  express-rate-limit with rate-limit-redis (its Lua script);
//   rl-store          express-rate-limit with RlExpressStore (RL.WINDOW ... FIXED);
//   rl-middleware     rl's own middleware (one RL.WINDOW ... FIXED rule).
import express from "express";
import { rateLimit } from "express-rate-limit";
import { RedisStore } from "rate-limit-redis";
import { createClient } from "redis";

import { forRedis, rlExpress, RlExpressStore } from "@rl/server";

const [variant, redisPort] = process.argv.slice(2);
const client = createClient({ url: `redis://127.0.0.1:${redisPort}` });
await client.connect();
const LIMIT = 1_000_000_000;
const WINDOW_MS = 60_000;

let limiter;
if (variant === "rate-limit-redis") {
  limiter = rateLimit({ windowMs: WINDOW_MS, limit: LIMIT, standardHeaders: "draft-8", legacyHeaders: false,
    store: new RedisStore({ prefix: "bench:rlr:", sendCommand: (...args) => client.sendCommand(args) }) });
} else if (variant === "rl-store") {
  limiter = rateLimit({ windowMs: WINDOW_MS, limit: LIMIT, standardHeaders: "draft-8", legacyHeaders: false,
    store: new RlExpressStore({ rl: forRedis(client), prefix: "bench:erl:", mode: "fixed" }) });
} else if (variant === "rl-middleware") {
  limiter = rlExpress({ rl: forRedis(client), prefix: "bench:mw", timeoutMs: 1000 }).route({
    rules: [{ name: "bench", limiter: { kind: "window", limit: LIMIT, window: WINDOW_MS / 1000, mode: "fixed" } }] });
} else {
  throw new Error(`unknown variant ${variant}`);
}

const app = express();
app.get("/bench", limiter, (_req, res) => { res.json({ ok: true }); });
const server = app.listen(0, "127.0.0.1", () => {
  console.log(`http://127.0.0.1:${server.address().port}`);
});
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
