/**
 * The shipped examples, run as shipped (`node examples/<framework>.mjs`,
 * importing the built package by its name) against redis-server with the
 * module: reads, an idempotent write, a per-ledger lock answering 409
 * while a reconciliation runs.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { raw, Server, SERVERS, until } from "./servers.js";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "../..");
let server: Server;
before(async () => { server = await Server.start(SERVERS[0]!.bin); });
after(async () => { await server.stop(); });

for (const framework of ["express", "fastify"]) {
  test(`examples/${framework}.mjs runs as shipped`, async () => {
    const proc = spawn(process.execPath, [join(PKG, `examples/${framework}.mjs`)], {
      cwd: PKG, env: { ...process.env, REDIS_URL: `redis://127.0.0.1:${server.port}`, PORT: "0" },
      stdio: ["ignore", "pipe", "inherit"],
    });
    try {
      const lines = createInterface({ input: proc.stdout! });
      const first = await Promise.race([once(lines, "line").then(([l]) => String(l)),
        once(proc, "exit").then(([c]) => Promise.reject(new Error(`example exited (${c})`)))]);
      const url = /listening on (\S+)/.exec(first)![1]!;
      const who = { "X-Tenant": `t-${framework}`, "X-Api-Key": "k1" };
      // a caller without a tenant is refused, not left unlimited (its rules' key would be undefined)
      assert.equal((await fetch(`${url}/v1/ledgers/L1`)).status, 401, "no X-Tenant");
      assert.equal((await fetch(`${url}/v1/exports`, { headers: { "X-Api-Key": "k1" } })).status, 401, "no X-Tenant");
      const read = await fetch(`${url}/v1/ledgers/L1`, { headers: who });
      assert.equal(read.status, 200);
      assert.equal(read.headers.get("ratelimit-policy"), '"key";q=100;qu="points";w=60, "tenant";q=300;qu="points";w=60');
      const post = (path: string, extra: Record<string, string> = {}) => fetch(`${url}${path}`, {
        method: "POST", headers: { ...who, "Content-Type": "application/json", ...extra }, body: JSON.stringify({ amount: 20_000 }) });
      assert.equal((await post("/v1/ledgers/L1/entries")).status, 400, "no Idempotency-Key");
      const w = await post("/v1/ledgers/L1/entries", { "Idempotency-Key": "op-1" });
      assert.equal(w.status, 201);
      assert.match(w.headers.get("ratelimit")!, /^"key";r=74;/, "25 points for a large amount");
      // the reconciliation runs 8 s: the conflict comes while it runs even on a loaded
      // machine, once its lock is seen in Redis (polled, not a fixed sleep)
      const running = post("/v1/ledgers/L1/reconcile?ms=8000", { "Idempotency-Key": "op-2" });
      const leases = () => raw(server.port, "RL.LEASE", "LIST", "rl:{L1}:reconcile-ledger");
      assert.ok(await until(async () => /^\*[1-9]/.test(await leases())), "the running reconciliation holds the ledger's lock");
      const conflict = await post("/v1/ledgers/L1/reconcile", { "Idempotency-Key": "op-3" });
      assert.equal(conflict.status, 409);
      assert.match(conflict.headers.get("retry-after")!, /^[1-5]$/, "the holder's expected end (5 s after it began)");
      assert.equal((await running).status, 200);
      assert.ok(await until(async () => (await leases()).startsWith("*0")), "the lock is released once the reconciliation ended");
      assert.equal((await fetch(`${url}/v1/exports`, { headers: who })).status, 200);
    } finally {
      const exited = once(proc, "exit");
      proc.kill("SIGTERM");
      await exited;
    }
  });
}
