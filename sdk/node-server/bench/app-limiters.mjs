// The limiters of the application benchmark, one per variant, on one
// node-redis client: the same route limit (1e9 requests a minute per
// client IP: never refused, every request is a decision) three ways.
//   rate-limit-redis  express-rate-limit with rate-limit-redis (its Lua script);
//   rl-store          express-rate-limit with RlExpressStore (RL.WINDOW ... FIXED);
//   rl-middleware     rl's own middleware (one RL.WINDOW ... FIXED rule).
import { rateLimit } from "express-rate-limit";
import { RedisStore } from "rate-limit-redis";

import { forRedis, rlExpress, RlExpressStore } from "@rl/server";

export const VARIANTS = ["rate-limit-redis", "rl-store", "rl-middleware"];
const LIMIT = 1_000_000_000;
const WINDOW_MS = 60_000;

/** The Express middleware of `variant` (`extra`: more express-rate-limit options). */
export function limiterOf(variant, client, extra = {}) {
  if (variant === "rate-limit-redis") {
    return rateLimit({ windowMs: WINDOW_MS, limit: LIMIT, standardHeaders: "draft-8", legacyHeaders: false, ...extra,
      store: new RedisStore({ prefix: "bench:rlr:", sendCommand: (...args) => client.sendCommand(args) }) });
  }
  if (variant === "rl-store") {
    return rateLimit({ windowMs: WINDOW_MS, limit: LIMIT, standardHeaders: "draft-8", legacyHeaders: false, ...extra,
      store: new RlExpressStore({ rl: forRedis(client), prefix: "bench:erl:", mode: "fixed" }) });
  }
  if (variant === "rl-middleware") {
    return rlExpress({ rl: forRedis(client), prefix: "bench:mw", timeoutMs: 1000 }).route({
      rules: [{ name: "bench", limiter: { kind: "window", limit: LIMIT, window: WINDOW_MS / 1000, mode: "fixed" } }] });
  }
  throw new Error(`unknown variant ${variant}`);
}
