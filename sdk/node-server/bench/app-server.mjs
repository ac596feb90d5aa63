// One Express server of the application benchmark (bench/app.mjs starts
// one per variant): `node bench/app-server.mjs <variant> <redis port>`,
// prints its URL. The same route, GET /bench, limited by the variant's
// limiter (bench/app-limiters.mjs).
import express from "express";
import { createClient } from "redis";

import { limiterOf } from "./app-limiters.mjs";

const [variant, redisPort] = process.argv.slice(2);
const client = createClient({ url: `redis://127.0.0.1:${redisPort}` });
await client.connect();
const limiter = limiterOf(variant, client);

const app = express();
app.get("/bench", limiter, (_req, res) => { res.json({ ok: true }); });
const server = app.listen(0, "127.0.0.1", () => {
  console.log(`http://127.0.0.1:${server.address().port}`);
});
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
