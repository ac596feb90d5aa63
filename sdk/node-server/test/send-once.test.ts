/**
 * A decision is charged once when the connection drops after the command
 * was sent: a TCP proxy in the test passes the client's first RL.TAKE to
 * the server and then closes the client's side before the reply. ioredis
 * (which sends unanswered commands again after it reconnects, and as a
 * Cluster when a node's connection closes) and node-redis get an error;
 * the server ran the command once. So does the Express and Fastify
 * middleware: the request is refused as its rule's failure setting says.
 */
import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer, Socket, type Server as NetServer } from "node:net";
import { after, before, describe, test } from "node:test";

import { Cluster, Redis } from "ioredis";
import { createClient } from "redis";

import { forIoredis, forRedis, type RlCommands } from "../src/index.js";
import { FRAMEWORKS, serve } from "./apps.js";
import { Server, SERVERS, sleep, startCluster } from "./servers.js";

/** A proxy to `port` that drops the client's connection right after passing its first RL.TAKE on. */
class DroppingProxy {
  readonly server: NetServer;
  readonly sockets = new Set<Socket>();
  dropped = false;

  constructor(port: number) {
    this.server = createServer((down) => {
      const up = new Socket();
      up.connect(port, "127.0.0.1");
      this.sockets.add(down).add(up);
      up.on("data", (d) => { if (!down.destroyed) down.write(d); });
      down.on("data", (d) => {
        up.write(d);
        if (!this.dropped && d.includes("RL.TAKE")) {
          this.dropped = true;
          down.destroy(); // the server still gets, and runs, the command
        }
      });
      down.on("close", () => setTimeout(() => up.destroy(), 300));
      up.on("close", () => down.destroy());
      for (const s of [up, down]) s.on("error", () => {});
    });
  }

  async listen(): Promise<number> {
    this.server.listen(0, "127.0.0.1");
    await once(this.server, "listening");
    return (this.server.address() as { port: number }).port;
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    this.server.close();
    await once(this.server, "close");
  }
}

const BUCKET = { capacity: 100, tokens: 100, period: 1000 };

for (const flavour of SERVERS) {
  describe(`at most once (${flavour.name})`, () => {
    let server: Server;
    let admin: Redis;
    before(async () => {
      server = await Server.start(flavour.bin);
      admin = new Redis(server.port, "127.0.0.1");
    });
    after(async () => {
      admin.disconnect();
      await server.stop();
    });

    /** Runs one RL.TAKE through `rl` over the dropping proxy; what the caller got and the charges. */
    async function dropOnce(key: string, rl: (port: number) => Promise<[RlCommands, () => Promise<void>]>) {
      await admin.config("RESETSTAT");
      const proxy = new DroppingProxy(server.port);
      const [commands, close] = await rl(await proxy.listen());
      try {
        await commands.box.status(key); // connected before the call under test
        const got = await commands.take(key, BUCKET).then((d) => `remaining ${d.remaining}`,
          (e: Error) => `error ${e.name}`);
        assert.ok(proxy.dropped);
        // a resend (if any) comes after a reconnect: give it the time
        await sleep(500);
        const stats = String(await admin.info("commandstats"));
        const calls = Number(/cmdstat_rl\.take:calls=(\d+)/.exec(stats)?.[1] ?? 0);
        const left = (await admin.call("RL.TAKE", key, 100, 100, 1000, "COST", 0) as number[])[2];
        return { got, calls, left };
      } finally {
        await close();
        await proxy.close();
      }
    }

    test("ioredis: the caller gets an error, the server runs the command once", async () => {
      const r = await dropOnce("once:io", async (port) => {
        const c = new Redis(port, "127.0.0.1"); // autoResendUnfulfilledCommands: true, the default
        return [forIoredis(c), async () => c.disconnect()];
      });
      assert.deepEqual(r, { got: "error RlConnectionClosedError", calls: 1, left: 99 });
    });

    test("node-redis: the caller gets an error, the server runs the command once", async () => {
      const r = await dropOnce("once:nr", async (port) => {
        const c = createClient({ url: `redis://127.0.0.1:${port}` });
        c.on("error", () => {});
        await c.connect();
        return [forRedis(c), async () => { c.destroy(); }];
      });
      assert.equal(r.calls, 1);
      assert.equal(r.left, 99);
      assert.match(r.got, /^error /);
    });

    for (const framework of FRAMEWORKS) {
      test(`${framework} middleware: a request whose RL.TAKE was sent is refused, charged once`, async () => {
        await admin.config("RESETSTAT");
        const proxy = new DroppingProxy(server.port);
        const c = new Redis(await proxy.listen(), "127.0.0.1");
        const rule = `once-${framework}`;
        const app = await serve(framework, { rl: forIoredis(c), timeoutMs: 5_000 }, [{ method: "GET", path: "/once",
          limits: { rules: [{ name: rule, limiter: { kind: "bucket", rate: 100, burst: 100, period: 1000 },
            onRedisFailure: "closed" }] } }]);
        try {
          await c.ping(); // connected before the request under test
          assert.equal((await fetch(`${app.url}/once`)).status, 503);
          assert.ok(proxy.dropped);
          await sleep(500); // a resend (if any) comes after a reconnect
          const stats = String(await admin.info("commandstats"));
          assert.equal(Number(/cmdstat_rl\.take:calls=(\d+)/.exec(stats)?.[1] ?? 0), 1);
          const next = await fetch(`${app.url}/once`);
          assert.equal(next.status, 200);
          assert.match(next.headers.get("ratelimit") ?? "", /;r=98;/);
        } finally {
          await app.close();
          c.disconnect();
          await proxy.close();
        }
      });
    }

    test("ioredis: the client and its rl commands work on after a drop", async () => {
      const proxy = new DroppingProxy(server.port);
      const c = new Redis(await proxy.listen(), "127.0.0.1");
      const rl = forIoredis(c);
      try {
        await assert.rejects(rl.take("once:after", BUCKET), { name: "RlConnectionClosedError" });
        assert.equal((await rl.take("once:after", BUCKET)).remaining, 98);
        assert.equal(await c.ping(), "PONG");
      } finally {
        c.disconnect();
        await proxy.close();
      }
    });

    test("ioredis: one rl connection per client, opened again after the client ended and reconnected", async () => {
      const c = new Redis(server.port, "127.0.0.1", { lazyConnect: true });
      try {
        await c.connect();
        const [a, b] = [forIoredis(c), forIoredis(c)];
        await a.take("once:reopen", BUCKET);
        await b.take("once:reopen", BUCKET);
        const named = async () => (String(await admin.client("LIST")).match(/cmd=rl\.take/g) ?? []).length;
        assert.equal(await named(), 1); // the two share the one duplicate
        await c.quit(); // the user's client ends: its duplicate is disconnected
        await sleep(100);
        await c.connect();
        assert.equal((await a.take("once:reopen", BUCKET)).remaining, 97);
      } finally {
        c.disconnect();
      }
    });
  });
}

describe("at most once (ioredis cluster)", () => {
  let nodes: Server[];
  before(async () => {
    nodes = await startCluster(SERVERS[0]!.bin);
  });
  after(async () => {
    for (const n of nodes) await n.stop();
  });

  test("a node's connection dropped after RL.TAKE was sent: an error, one charge", async () => {
    // "{a}" hashes to slot 15495: the second node, reached through the proxy (natMap)
    const owner = nodes[1]!;
    const admin = new Redis(owner.port, "127.0.0.1");
    await admin.config("RESETSTAT");
    const proxy = new DroppingProxy(owner.port);
    const port = await proxy.listen();
    const c = new Cluster([{ host: "127.0.0.1", port: nodes[0]!.port }],
      { natMap: { [`127.0.0.1:${owner.port}`]: { host: "127.0.0.1", port } } });
    try {
      const rl = forIoredis(c);
      await rl.box.status("rl:{a}:once");
      await assert.rejects(rl.take("rl:{a}:once", BUCKET), /closed/);
      assert.ok(proxy.dropped);
      await sleep(500);
      const stats = String(await admin.info("commandstats"));
      assert.equal(Number(/cmdstat_rl\.take:calls=(\d+)/.exec(stats)?.[1] ?? 0), 1);
      assert.equal((await rl.take("rl:{a}:once", BUCKET)).remaining, 98);
    } finally {
      c.disconnect();
      admin.disconnect();
      await proxy.close();
    }
  });
});
