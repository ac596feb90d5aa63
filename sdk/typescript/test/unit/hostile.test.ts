/** Hostile servers on 127.0.0.1 and the real clock: redirects, aborts, deadlines, long sleeps. Each test is bounded to a few seconds. */
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { LockoutError, RateLimitError, RetryingFetch, systemClock } from "../../src/index.js";

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

/** A server on an ephemeral loopback port; records the X-Api-Key of each request. */
async function serve(handler: Handler): Promise<{ url: string; keys: Array<string | undefined>; close: () => Promise<void> }> {
  const keys: Array<string | undefined> = [];
  const server: Server = createServer((req, res) => {
    keys.push(req.headers["x-api-key"] as string | undefined);
    handler(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    keys,
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

test("systemClock sleeps past setTimeout's 2^31-1 ms limit instead of firing at once, and aborts", async () => {
  const controller = new AbortController();
  let settled = "pending";
  const slept = systemClock.sleep(2 ** 31 / 1000 + 10, controller.signal).then(
    () => (settled = "resolved"),
    (e: unknown) => (settled = `rejected ${(e as Error).name}`),
  );
  await new Promise((resolve) => setTimeout(resolve, 100));
  assert.equal(settled, "pending");
  controller.abort();
  await slept;
  assert.equal(settled, "rejected AbortError");
  await assert.rejects(systemClock.sleep(1, AbortSignal.abort()), { name: "AbortError" });
});

test("the API key is not sent on a cross-origin redirect, and a foreign box does not lock it", async () => {
  const foreign = await serve((_req, res) => {
    res.writeHead(429, { "X-Penalty-Box-Status": "Active-Lockout", "Retry-After": "31536000" }).end();
  });
  const home = await serve((req, res) => {
    if (req.url === "/redirect") res.writeHead(302, { Location: `${foreign.url}/steal` }).end();
    else res.writeHead(200).end("ok");
  });
  try {
    const c = new RetryingFetch({ baseUrl: home.url, headers: { "X-Api-Key": "SECRET" } });
    const r = await c.fetch("/redirect");
    assert.equal(r.status, 302);
    assert.deepEqual(foreign.keys, []);
    assert.equal((await c.fetch("/ok")).status, 200);
    // the caller asks to follow: the foreign answer reaches the caller but locks nothing at home
    const err = await c.fetch("/redirect", { redirect: "follow" }).catch((e: unknown) => e);
    assert.ok(err instanceof LockoutError);
    assert.equal((await c.fetch("/ok")).status, 200);
    // without a key header, fetch follows as usual
    const anon = new RetryingFetch({ baseUrl: home.url });
    assert.ok((await anon.fetch("/redirect").catch((e: unknown) => e)) instanceof LockoutError);
  } finally {
    await home.close();
    await foreign.close();
  }
});

test("the caller's signal aborts a wait for Retry-After", async () => {
  let n = 0;
  const s = await serve((_req, res) => {
    n += 1;
    if (n === 1) res.writeHead(429, { "Retry-After": "3" }).end();
    else res.writeHead(200).end("ok");
  });
  try {
    const c = new RetryingFetch({ baseUrl: s.url });
    const t0 = performance.now();
    await assert.rejects(c.fetch("/x", { signal: AbortSignal.timeout(200) }), { name: "TimeoutError" });
    assert.ok(performance.now() - t0 < 1500);
    assert.equal(n, 1);
  } finally {
    await s.close();
  }
});

test("the deadline bounds the request itself", async () => {
  const s = await serve((_req, res) => {
    const timer = setTimeout(() => res.writeHead(200).end("late"), 3000);
    res.on("close", () => clearTimeout(timer));
  });
  try {
    const c = new RetryingFetch({ baseUrl: s.url });
    const t0 = performance.now();
    await assert.rejects(c.fetch("/slow", { deadlineSeconds: 0.3 }), { name: "TimeoutError" });
    assert.ok(performance.now() - t0 < 1500);
  } finally {
    await s.close();
  }
});

test("a large problem body over the network is not read whole", async () => {
  const size = 8 * 1024 * 1024;
  const s = await serve((req, res) => {
    const chunked = req.url === "/chunked";
    res.writeHead(429, {
      "Content-Type": "application/problem+json",
      ...(chunked ? {} : { "Content-Length": String(size + 20) }),
    });
    res.write('{"request_id":"r","a":"');
    const piece = "x".repeat(64 * 1024);
    let sent = 0;
    const more = (): void => {
      while (sent < size) {
        sent += piece.length;
        if (!res.write(piece)) {
          res.once("drain", more);
          return;
        }
      }
      res.end('"}');
    };
    more();
  });
  try {
    const c = new RetryingFetch({ baseUrl: s.url, policy: { maxAttempts: 1 } });
    for (const path of ["/declared", "/chunked"]) {
      const err = await c.fetch(path, { method: "POST" }).catch((e: unknown) => e);
      assert.ok(err instanceof RateLimitError, String(err));
      assert.equal(err.problem, null, path);
      await err.response?.body?.cancel();
    }
  } finally {
    await s.close();
  }
});
