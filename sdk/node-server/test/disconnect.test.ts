/**
 * A client that goes away while rl decides (Redis paused, the request's
 * socket closed before the verdict): the lease or lock it was granted is
 * released at once, not left for its ttl, and the handler never runs; on
 * Express and Fastify, over raw sockets to real servers.
 */
import assert from "node:assert/strict";
import { once } from "node:events";
import { Socket } from "node:net";
import { after, before, describe, test } from "node:test";

import { Redis } from "ioredis";

import { forIoredis, ruleKey, type DecisionEvent, type RlCommands } from "../src/index.js";
import { FRAMEWORKS, serve, type AnyReq, type App } from "./apps.js";
import { raw, Server, SERVERS, sleep, until } from "./servers.js";

/** Sends `request` on a fresh socket to `url`'s port and closes the socket after `closeAfterMs`. */
async function sendAndLeave(url: string, request: string, closeAfterMs: number): Promise<void> {
  const sock = new Socket();
  sock.connect(Number(new URL(url).port), "127.0.0.1");
  await once(sock, "connect");
  sock.write(request);
  await sleep(closeAfterMs);
  sock.destroy();
}

for (const framework of FRAMEWORKS) {
  describe(`${framework}: a client gone before the verdict`, () => {
    let server: Server;
    let redis: Redis;
    let rl: RlCommands;
    let app: App;
    const events: DecisionEvent[] = [];
    before(async () => {
      server = await Server.start(SERVERS[0]!.bin);
      redis = new Redis(server.port, "127.0.0.1");
      rl = forIoredis(redis);
      app = await serve(framework, { rl, timeoutMs: 15_000, onDecision: (e) => events.push(e) }, [
        { method: "GET", path: "/pool", limits: { rules: [{ name: "pool", limiter: { kind: "lease", max: 1, ttl: 30 } }] } },
        { method: "POST", path: "/ledgers/:id/reconcile",
          limits: { locks: [{ name: "ledger", key: (req: AnyReq) => req.params["id"], ttl: 30 }] } },
      ]);
    });
    after(async () => {
      await app.close();
      redis.disconnect();
      await server.stop();
    });

    const cases = [
      { what: "lease", path: "/pool?gate=gone-pool", gate: "gone-pool", method: "GET", key: ruleKey("rl", "127.0.0.1", "pool") },
      { what: "lock", path: "/ledgers/G1/reconcile?gate=gone-lock", gate: "gone-lock", method: "POST", key: ruleKey("rl", "G1", "ledger") },
    ];
    for (const c of cases) {
      test(`its ${c.what} is released at once and the handler does not run`, async () => {
        events.length = 0;
        // Redis answers nothing for 600 ms: the client leaves (100 ms) before the verdict comes
        await raw(server.port, "CLIENT", "PAUSE", 600, "ALL");
        await sendAndLeave(app.url, `${c.method} ${c.path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n`, 100);
        assert.ok(await until(() => events.some((e) => e.decision === "allowed")), "decided (granted) after the pause");
        let live = -1;
        // the ttl is 30 s: released within 5 s means released by the middleware
        assert.ok(await until(async () => (live = (await rl.lease.list(c.key)).length) === 0), `still held: ${live}`);
        await sleep(100);
        assert.equal(app.gates.entered.get(c.gate), undefined, "the handler did not run for a client that left");
      });
    }
  });
}
