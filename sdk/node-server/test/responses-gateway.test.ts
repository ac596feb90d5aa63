/**
 * sdk/responses.json against the real gateway: nginx with the gateway's
 * Lua library and a rule policy made of the file's cases
 * (sdk/e2e/responses_policy.lua), Redis with the module, both started by
 * sdk/e2e/launcher.py. Each case's path is driven to the case's reply
 * (requests before it, a request holding a lease, a box tripped by hand)
 * and its response must be the one the file gives.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";

import { raw, REPO, until } from "./servers.js";
import { differences, VECTORS } from "./vectors.js";

let gw: { url: string; redis_port: number };
let proc: ChildProcess;

before(async () => {
  proc = spawn(process.env["RL_SDK_PYTHON"] ?? "python3", [join(REPO, "sdk/e2e/launcher.py")], {
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, RL_E2E_POLICY: join(REPO, "sdk/e2e/responses_policy.lua") },
  });
  const lines = createInterface({ input: proc.stdout! });
  const first = await Promise.race([
    once(lines, "line").then(([l]) => String(l)),
    once(proc, "exit").then(([code]) => Promise.reject(new Error(`launcher exited (${code})`))),
  ]);
  gw = JSON.parse(first) as typeof gw;
});

after(async () => {
  proc.stdin?.end();
  const exited = once(proc, "exit");
  const timer = setTimeout(() => proc.kill("SIGKILL"), 15_000);
  await exited;
  clearTimeout(timer);
});

for (const v of VECTORS.cases.filter((c) => c.gateway !== null)) {
  test(`gateway answers ${v.name} as sdk/responses.json says`, async () => {
    const g = v.gateway!;
    const startMs = Date.now();
    const url = gw.url + v.request.path;
    if (g.trip) {
      await raw(gw.redis_port, "RL.BOX", "TRIP", `rl:{ip:127.0.0.1}:${v.rules[0]!.name}`, g.trip.level, g.trip.duration);
    }
    for (let i = 0; i < (g.before ?? 0); i++) await (await fetch(url)).arrayBuffer();
    let holder: Promise<Response> | undefined;
    if (g.hold) {
      // the holder runs `hold` s (8): long enough for the request below on a
      // loaded machine; its lease is polled for, not assumed after a sleep
      holder = fetch(`${url}?hold=${g.hold}`);
      const key = `rl:{ip:127.0.0.1}:${v.rules[0]!.name}`;
      const held = await until(async () => /^\*[1-9]/.test(await raw(gw.redis_port, "RL.LEASE", "LIST", key)));
      assert.ok(held, `${v.name}: the holder never got its lease`);
    }
    const sent = Date.now();
    const resp = await fetch(url);
    const seen = Date.now();
    const text = await resp.text();
    await (await holder)?.arrayBuffer();
    const headers = Object.fromEntries([...resp.headers.entries()]);
    const body = v.expect.body ? JSON.parse(text) as Record<string, unknown> : undefined;
    if (body) assert.match(String(body["request_id"]), /^[0-9a-f]{32}$/);
    const diff = differences(v, resp.status, headers, body, { startMs, sentMs: sent, seenMs: seen }, ["request_id"]);
    assert.deepEqual(diff, [], `${v.name}: ${v.about}`);
  });
}
