/**
 * Real servers for the tests: redis-server and Valkey with the rl module
 * on free loopback ports (standalone or a two-node cluster), killed and
 * restarted on the same port for the failure tests.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, Socket } from "node:net";
import { homedir, tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { Redis } from "ioredis";

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository (build-test/test -> sdk/node-server -> repo). */
export const REPO = resolve(HERE, "../../../..");
export const MODULE = resolve(process.env["RL_MODULE"] ?? join(REPO, "target/release/librl.so"));

/** The servers every suite runs on: Debian's redis-server and Valkey 8.1. */
export const SERVERS: { name: string; bin: string }[] = [
  { name: "redis", bin: process.env["REDIS_SERVER"] ?? "redis-server" },
  { name: "valkey", bin: process.env["RL_VALKEY_SERVER"]
      ?? join(homedir(), ".cache/rl/valkey-8.1.8/bin/valkey-server") },
];

/** A 127.0.0.1 port that was free a moment ago. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, "127.0.0.1");
  await once(srv, "listening");
  const port = (srv.address() as { port: number }).port;
  srv.close();
  await once(srv, "close");
  return port;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls `check` until it holds, at most 100 times 50 ms apart: whether it held. */
export async function until(check: () => boolean | Promise<boolean>): Promise<boolean> {
  for (let i = 0; i < 100; i++) {
    if (await check()) return true;
    await sleep(50);
  }
  return false;
}

/** One raw command over a fresh connection (admin calls in tests). */
export async function raw(port: number, ...args: (string | number)[]): Promise<string> {
  const sock = new Socket();
  sock.connect(port, "127.0.0.1");
  await once(sock, "connect");
  const parts = args.map(String);
  sock.write(`*${parts.length}\r\n` + parts.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join(""));
  let out = "";
  const deadline = Date.now() + 5000;
  for await (const chunk of sock) {
    out += String(chunk);
    if (out.endsWith("\r\n") || Date.now() > deadline) break;
  }
  sock.destroy();
  return out;
}

/** A redis-server (or valkey-server) with the module. */
export class Server {
  proc: ChildProcess | undefined;
  readonly dir = mkdtempSync(join(tmpdir(), "rl-node-server-"));
  constructor(readonly bin: string, readonly port: number, readonly cluster = false) {}

  static async start(bin: string, cluster = false): Promise<Server> {
    if (!existsSync(MODULE)) throw new Error(`rl module not found at ${MODULE}: run cargo build --release`);
    for (let attempt = 0; attempt < 3; attempt++) {
      const s = new Server(bin, await freePort(), cluster);
      if (await s.launch()) return s;
    }
    throw new Error(`${bin}: no free port after 3 attempts`);
  }

  /** Starts the process (again, on the same port); false when it exited. */
  async launch(): Promise<boolean> {
    const args = ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
      "--dir", this.dir, "--loadmodule", MODULE];
    if (this.cluster) args.push("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf");
    this.proc = spawn(this.bin, args, { stdio: "ignore" });
    const exited = once(this.proc, "exit").then(() => false);
    for (let i = 0; i < 150; i++) {
      const up = await Promise.race([raw(this.port, "PING").then((r) => r.startsWith("+PONG"), () => false), exited]);
      if (up) return true;
      if (this.proc.exitCode !== null) return false;
      await sleep(100);
    }
    return false;
  }

  /** Kills the process (SIGKILL) and waits for it. */
  async kill(): Promise<void> {
    const p = this.proc;
    if (p && p.exitCode === null && p.signalCode === null) {
      const gone = once(p, "exit");
      p.kill("SIGKILL");
      await gone;
    }
  }

  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A two-node cluster (slots split in halves), ready once both say ok. */
export async function startCluster(bin: string): Promise<Server[]> {
  const nodes = [await Server.start(bin, true), await Server.start(bin, true)];
  await raw(nodes[0]!.port, "CLUSTER", "ADDSLOTSRANGE", 0, 8191);
  await raw(nodes[1]!.port, "CLUSTER", "ADDSLOTSRANGE", 8192, 16383);
  await raw(nodes[0]!.port, "CLUSTER", "MEET", "127.0.0.1", nodes[1]!.port);
  for (let i = 0; i < 200; i++) {
    const states = await Promise.all(nodes.map((n) => raw(n.port, "CLUSTER", "INFO")));
    if (states.every((s) => s.includes("cluster_state:ok") && s.includes("cluster_known_nodes:2"))) return nodes;
    await sleep(100);
  }
  throw new Error("cluster did not become ok");
}

/**
 * For a suite (call it inside describe): redis-server with the module
 * started before its tests, with an ioredis client on it; both stopped after.
 */
export function redisForSuite(): { server(): Server; redis(): Redis } {
  let server: Server;
  let redis: Redis;
  before(async () => {
    server = await Server.start(SERVERS[0]!.bin);
    redis = new Redis(server.port, "127.0.0.1");
  });
  after(async () => {
    redis.disconnect();
    await server.stop();
  });
  return { server: () => server, redis: () => redis };
}
