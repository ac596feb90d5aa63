/**
 * The SDK against the real gateway (nginx + the Lua library) and Redis with
 * the rl module, started by `sdk/e2e/launcher.py` (python3, standard library
 * only; `RL_SDK_PYTHON` names another interpreter). The policy
 * (`sdk/e2e/policy.lua`): 5-point buckets refilling at 1 point a second, 20
 * strikes in 60 s box a key, level-1 boxes of 4 s (delta-seconds) or 6 s
 * (HTTP-date). Each scenario has its own key, so they all run at once.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { LockoutError, Pacer, RateLimitError, RetryingFetch, type RetryingFetchOptions } from "../../src/index.js";

const HERE = dirname(fileURLToPath(import.meta.url));
// build-test/test/e2e -> the repository's sdk/e2e
const LAUNCHER = resolve(HERE, "../../../../e2e/launcher.py");
const THRESHOLD = 20;
const BURST = 5;
const RATE = 1;
const HONOUR_SECONDS = 60;
const PACED_SECONDS = 15;

interface Launched {
  url: string;
  upstream_url: string;
  redis_port: number;
}

let gw: Launched;
let proc: ChildProcess;

before(async () => {
  proc = spawn(process.env["RL_SDK_PYTHON"] ?? "python3", [LAUNCHER], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: proc.stdout! });
  const first = await Promise.race([
    once(lines, "line").then(([l]) => String(l)),
    once(proc, "exit").then(([code]) => Promise.reject(new Error(`launcher exited (${code})`))),
  ]);
  gw = JSON.parse(first) as Launched;
});

after(async () => {
  proc.stdin?.end();
  const exited = once(proc, "exit");
  const timer = setTimeout(() => proc.kill("SIGKILL"), 15_000);
  await exited;
  clearTimeout(timer);
});

const sleep = (s: number) => new Promise((r) => setTimeout(r, s * 1000));
const now = () => performance.now() / 1000;

interface Seen {
  at: number;
  status: number;
  retryAfter: string | null;
  boxStatus: string | null;
  strikesRemaining: number | null;
}

/** A fetch that records every request's send time and every response. */
function recorder() {
  const sentAt: number[] = [];
  const seen: Seen[] = [];
  const fetch: typeof globalThis.fetch = async (input, init) => {
    sentAt.push(now());
    const resp = await globalThis.fetch(input, init);
    let strikes: number | null = null;
    if ((resp.headers.get("content-type") ?? "").includes("json")) {
      const body = (await resp.clone().json()) as Record<string, unknown>;
      strikes = typeof body["penalty_strikes_remaining"] === "number" ? body["penalty_strikes_remaining"] : null;
    }
    seen.push({ at: now(), status: resp.status, retryAfter: resp.headers.get("retry-after"),
                boxStatus: resp.headers.get("x-penalty-box-status"), strikesRemaining: strikes });
    return resp;
  };
  return { sentAt, seen, fetch };
}

function client(name: string, fetch: typeof globalThis.fetch, options: RetryingFetchOptions = {}): RetryingFetch {
  return new RetryingFetch({ baseUrl: gw.url, headers: { "X-Api-Key": `k-${name}` }, fetch, ...options });
}

/** RL.BOX STATUS of a scenario's key, through the launcher's Python (no Redis client in this package). */
async function boxStatus(name: string): Promise<number[]> {
  const code = `import sys; sys.path.insert(0, ${JSON.stringify(dirname(LAUNCHER))}); import launcher, json; ` +
    `print(json.dumps(launcher.redis_call(${gw.redis_port}, "RL.BOX", "STATUS", "rl:{t:t-${name}}:key:${name}")))`;
  const p = spawn(process.env["RL_SDK_PYTHON"] ?? "python3", ["-c", code], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  p.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  const [exitCode] = await once(p, "exit");
  assert.equal(exitCode, 0);
  return JSON.parse(out) as number[];
}

async function upstreamCount(key: string): Promise<{ received: number; processed: number }> {
  const r = await fetch(`${gw.upstream_url}/_count?key=${encodeURIComponent(key)}`);
  return (await r.json()) as { received: number; processed: number };
}

/** GETs with a scenario's key, no retries, no waits, until the key is boxed (bounded). */
async function drain(name: string, limit = 60): Promise<void> {
  for (let i = 0; i < limit; i++) {
    const r = await fetch(`${gw.url}/v1/ledgers`, { headers: { "X-Api-Key": `k-${name}` } });
    await r.arrayBuffer();
    if (r.headers.get("x-penalty-box-status") === "Active-Lockout") return;
  }
  assert.fail(`${name}: not boxed after ${limit} requests`);
}

describe("the SDK against the gateway", { concurrency: true }, () => {
  test("a client honouring the waits for 60 s of full use is never struck nor boxed ", async () => {
    const rec = recorder();
    const c = client("honour", rec.fetch);
    let allowed = 0;
    let gaveUp: unknown = null;
    const start = now();
    for (let i = 0; i < 10_000 && now() - start < HONOUR_SECONDS; i++) {
      try {
        const r = await c.fetch("/v1/ledgers");
        assert.equal(r.status, 200);
        await r.arrayBuffer();
        allowed++;
      } catch (e) {
        gaveUp = e;
        break;
      }
    }
    const elapsed = now() - start;
    rec.seen.slice(0, -1).forEach((s, i) => {
      if (s.status === 429 && s.retryAfter !== null) {
        assert.ok(rec.sentAt[i + 1]! - s.at >= Number(s.retryAfter), `retry ${i + 1} came early`);
      }
    });
    const throttled = rec.seen.filter((s) => s.status === 429);
    assert.ok(throttled.length >= 10, "the client never ran into the limit: nothing was tested");
    assert.equal(gaveUp, null, `the SDK gave up: ${String(gaveUp)}`);
    assert.deepEqual(rec.seen.filter((s) => s.boxStatus === "Active-Lockout"), []);
    assert.deepEqual(new Set(throttled.map((s) => s.strikesRemaining)), new Set([THRESHOLD]), "strikes were counted");
    assert.deepEqual(await boxStatus("honour"), [0, 0, 0, 0]);
    assert.ok(allowed >= 0.5 * (BURST + elapsed * RATE), `${allowed} in ${elapsed} s`);
  });

  test("a paced client never meets a 429", async () => {
    const rec = recorder();
    const c = client("paced", rec.fetch, { pacer: new Pacer() });
    let allowed = 0;
    const start = now();
    for (let i = 0; i < 10_000 && now() - start < PACED_SECONDS; i++) {
      const r = await c.fetch("/v1/ledgers");
      assert.equal(r.status, 200);
      await r.arrayBuffer();
      allowed++;
    }
    const elapsed = now() - start;
    assert.deepEqual(rec.seen.filter((s) => s.status !== 200 || s.boxStatus !== null), []);
    assert.equal(c.rateLimit?.binding?.name, "steady-key");
    assert.ok(allowed >= 0.5 * (BURST + elapsed * RATE), `${allowed} in ${elapsed} s`);
    assert.deepEqual(await boxStatus("paced"), [0, 0, 0, 0]);
  });

  test("a client without retries or waits is warned, then boxed", async () => {
    const rec = recorder();
    const c = client("rude", rec.fetch, { policy: { maxAttempts: 1 } });
    const errors: RateLimitError[] = [];
    for (let i = 0; i < 60; i++) {
      try {
        await (await c.fetch("/v1/ledgers")).arrayBuffer();
      } catch (e) {
        assert.ok(e instanceof RateLimitError);
        errors.push(e);
        if (e instanceof LockoutError) break;
      }
    }
    assert.ok(errors.at(-1) instanceof LockoutError, errors.map((e) => e.reason).join(","));
    const warned = rec.seen.filter((s) => s.boxStatus === "Warning");
    assert.ok(warned.length >= THRESHOLD - 1);
    assert.ok(Math.min(...warned.map((s) => s.strikesRemaining ?? 0)) <= 1);
    assert.ok(errors.every((e) => (e.requestId ?? "").length === 32));
    assert.equal(rec.sentAt.length, rec.seen.length);
    const [level, ttlMs, offenses] = await boxStatus("rude");
    assert.equal(level, 1);
    assert.equal(offenses, 1);
    assert.ok(ttlMs! > 0 && ttlMs! <= 4000);
  });

  test("Active-Lockout stops retries until Retry-After has passed", async () => {
    await drain("lock");
    const rec = recorder();
    const c = client("lock", rec.fetch);
    const t0 = now();
    const err = await c.fetch("/v1/ledgers").then(() => null, (e: unknown) => e);
    assert.ok(err instanceof LockoutError, String(err));
    assert.ok(now() - t0 < 2, "not at once");
    assert.equal(err.attempts, 1);
    assert.equal(err.status, 429);
    assert.ok(err.retryAfter !== null && err.retryAfter > 0 && err.retryAfter <= 4);
    assert.equal(err.problem?.["penalty_level"], 1);
    assert.equal(err.requestId?.length, 32);
    assert.equal(rec.sentAt.length, 1);
    const again = await c.fetch("/v1/ledgers").then(() => null, (e: unknown) => e);
    assert.ok(again instanceof LockoutError && again.attempts === 0);
    assert.equal(rec.sentAt.length, 1);
    await sleep(err.retryAfter + 0.2);
    assert.equal((await c.fetch("/v1/ledgers")).status, 200);
  });

  test("an HTTP-date Retry-After is read against the Date header", async () => {
    await drain("dated");
    const c = client("dated", globalThis.fetch);
    const err = await c.fetch("/v1/ledgers").then(() => null, (e: unknown) => e);
    assert.ok(err instanceof LockoutError, String(err));
    const raw = err.response?.headers.get("retry-after") ?? "";
    const date = err.response?.headers.get("date") ?? "";
    assert.ok(!/^[0-9]+$/.test(raw), raw); // the 6 s box is announced as an HTTP-date
    // the wait is the HTTP-date minus the response's Date, at most the box's 6 s (+1: whole seconds)
    const expected = (Date.parse(raw) - Date.parse(date)) / 1000;
    assert.equal(err.retryAfter, expected, `${raw} / ${date}`);
    assert.ok(expected > 0 && expected <= 7, `${raw} / ${date}`);
    await sleep(err.retryAfter + 0.2);
    assert.equal((await c.fetch("/v1/ledgers")).status, 200);
  });

  test("a retried POST with an Idempotency-Key lands once", async () => {
    let n = 0;
    const rec = recorder();
    const c = client("idem", rec.fetch, { newIdempotencyKey: () => `ts-idem-key-${n++}` });
    const post = (path: string, body: string, idempotencyKey?: boolean) => {
      rec.seen.length = 0;
      return c.fetch(path, { method: "POST", body, headers: { "Content-Type": "application/json" },
                             ...(idempotencyKey ? { idempotencyKey } : {}) });
    };
    const statuses = () => rec.seen.map((s) => s.status);
    const exhaust = async () => {
      for (let i = 0; i <= BURST; i++) await (await fetch(`${gw.url}/v1/ledgers`, { headers: { "X-Api-Key": "k-idem" } })).arrayBuffer();
    };
    // the upstream does the work but its answer is lost (503): the retry replays
    const r1 = await post("/v1/ledgers/L1/entries?fail_first=1", '{"amount":5}', true);
    assert.equal(r1.status, 200);
    assert.equal(((await r1.json()) as { replayed: boolean }).replayed, true);
    assert.deepEqual(statuses(), [503, 200]);
    assert.deepEqual(await upstreamCount("ts-idem-key-0"), { received: 2, processed: 1 });
    // the gateway refuses it (429): the retry after Retry-After is the one that lands. A point
    // may refill between emptying the bucket and the POST: it then lands at once (no retry
    // tested), and the scenario is tried again (bounded)
    for (let i = 1; i <= 5; i++) {
      await exhaust();
      const r2 = await post("/v1/ledgers/L1/entries", '{"amount":6}', true);
      assert.equal(r2.status, 200);
      assert.equal(((await r2.json()) as { replayed: boolean }).replayed, false);
      assert.deepEqual(await upstreamCount(`ts-idem-key-${i}`), { received: 1, processed: 1 });
      if (statuses()[0] === 429) break;
    }
    assert.deepEqual(statuses(), [429, 200]);
    // without a key a POST is not retried (same bound)
    let err: unknown = null;
    for (let i = 0; i < 5 && err === null; i++) {
      await exhaust();
      err = await post("/v1/ledgers/L1/entries", '{"amount":7}').then(() => null, (e: unknown) => e);
    }
    assert.ok(err instanceof RateLimitError && err.reason === "not_retryable" && err.attempts === 1, String(err));
    assert.deepEqual(statuses(), [429]);
    assert.equal(err.requestId?.length, 32);
  });

  test("a 409 conflict polls the existing job", async () => {
    const headers = { "X-Api-Key": "k-conflict" };
    const holder = fetch(`${gw.url}/v1/ledgers/reconcile?ledger_id=L9&hold=3`,
                         { method: "POST", headers: { ...headers, "Idempotency-Key": "ts-first-run" } });
    const deadline = now() + 10;
    while ((await upstreamCount("ts-first-run")).received === 0) {
      assert.ok(now() < deadline, "the first reconcile never reached the API");
      await sleep(0.05);
    }
    const rec = recorder();
    const polled: number[] = [];
    const c = client("conflict", rec.fetch, {
      onConflict: async (conflict) => {
        polled.push(conflict.status);
        return fetch(`${gw.url}/v1/ledgers/L9`, { headers });
      },
    });
    const r = await c.fetch("/v1/ledgers/reconcile?ledger_id=L9", { method: "POST", idempotencyKey: "ts-second-run" });
    assert.deepEqual(polled, [409]);
    assert.equal(r.status, 200);
    assert.equal(((await r.json()) as { uri: string }).uri, "/v1/ledgers/L9");
    assert.deepEqual(rec.seen.map((s) => s.status), [409]);
    assert.equal((await upstreamCount("ts-second-run")).received, 0);
    await (await holder).arrayBuffer();
  });
});
