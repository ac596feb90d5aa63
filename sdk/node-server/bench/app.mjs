// The application benchmark's Node half (`make bench-app`): one Redis with
// the module, one Express server per variant (bench/app-server.mjs, each
// its own process), the same route; interleaved rounds (every variant once
// per round, the order rotating), each round CONNECTIONS keep-alive
// connections for SECONDS seconds. Per variant: requests per second and
// p99 latency (medians over the rounds), Redis CPU per decision from
// INFO commandstats (the commands' own time; a script's includes the
// commands it calls) and from INFO cpu (the server's user + system time,
// networking included), and the Express server's own CPU per request
// (/proc/PID/stat: steadier than requests per second on a shared
// machine, as it does not depend on whether the server got a core). The ratios to rate-limit-redis are taken within
// each round (the variants run one after the other: a shared machine's
// load changes less between them than across the run), then their median.
// Then the targets: rl's Redis command time per decision at most 0.5x
// rate-limit-redis's, rl's throughput at least 1.0x; with the server CPU
// ratio beside them and what one command per decision costs Redis outside
// the command (reading it, writing the reply, the event loop: the same
// whatever the command is, so a floor under any such store's CPU). Then
// the limiters alone, without HTTP or Express: each variant's middleware
// function called in this process with a minimal request and response, on
// the same Redis, CONNECTIONS decisions in flight, DECISIONS per round,
// in interleaved rounds: this process's CPU per decision (the limiter and
// its Redis client: the part a store or middleware chooses, steadier than
// a whole server's on a shared machine). Environment: RL_MODULE,
// REDIS_SERVER, ROUNDS (12), SECONDS (2), CONNECTIONS (32), DECISIONS (20000).
import { execFileSync, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { once } from "node:events";
import http from "node:http";
import { createServer, Socket } from "node:net";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { createClient } from "redis";

import { limiterOf, VARIANTS } from "./app-limiters.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const MODULE = resolve(process.env.RL_MODULE ?? join(HERE, "../../../target/release/librl.so"));
const ROUNDS = Number(process.env.ROUNDS ?? 12);
const SECONDS = Number(process.env.SECONDS ?? 2);
const CONNECTIONS = Number(process.env.CONNECTIONS ?? 32);
const DECISIONS = Number(process.env.DECISIONS ?? 20000);
/** The commands a decision sends (scripts count with the commands they call). */
const TOP_LEVEL = /^(evalsha|eval|evalsha_ro|eval_ro|fcall|rl\.|cl\.)/;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const CLK_TCK = Number(execFileSync("getconf", ["CLK_TCK"]).toString().trim());

/** A process's CPU seconds (user + system) from /proc/PID/stat. */
function processCpu(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / CLK_TCK; // utime, stime (fields 14 and 15)
}

async function freePort() {
  const s = createServer().listen(0, "127.0.0.1");
  await once(s, "listening");
  const { port } = s.address();
  s.close();
  return port;
}

/** One command on a fresh connection; the reply's text. */
async function redis(port, ...args) {
  const sock = new Socket();
  sock.connect(port, "127.0.0.1");
  await once(sock, "connect");
  sock.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join(""));
  let out = "";
  const deadline = Date.now() + 5000;
  for await (const chunk of sock) {
    out += chunk;
    const m = /^\$(\d+)\r\n/.exec(out);
    if ((m && out.length >= m[0].length + Number(m[1]) + 2) || (!m && out.endsWith("\r\n")) || Date.now() > deadline) break;
  }
  sock.destroy();
  return out;
}

/** Redis CPU seconds (user + sys) and, per command, [calls, usec]. */
async function redisStats(port) {
  const cpu = await redis(port, "INFO", "cpu");
  const user = Number(/used_cpu_user:([\d.]+)/.exec(cpu)[1]);
  const sys = Number(/used_cpu_sys:([\d.]+)/.exec(cpu)[1]);
  const stats = await redis(port, "INFO", "commandstats");
  const cmds = {};
  for (const m of stats.matchAll(/cmdstat_([^:]+):calls=(\d+),usec=(\d+)/g)) cmds[m[1]] = [Number(m[2]), Number(m[3])];
  return { cpu: user + sys, cmds };
}

/** CONNECTIONS clients for SECONDS seconds: requests done, latencies (ms), non-200 answers. */
async function load(url) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const latencies = [];
  let bad = 0;
  const end = Date.now() + SECONDS * 1000;
  const one = () => new Promise((res, rej) => {
    const t0 = process.hrtime.bigint();
    http.get(`${url}/bench`, { agent }, (r) => {
      r.resume();
      r.on("end", () => {
        latencies.push(Number(process.hrtime.bigint() - t0) / 1e6);
        if (r.statusCode !== 200) bad++;
        res();
      });
    }).on("error", rej);
  });
  await Promise.all(Array.from({ length: CONNECTIONS }, async () => {
    while (Date.now() < end) await one();
  }));
  agent.destroy();
  return { n: latencies.length, latencies, bad };
}

/** One decision of `limiter` (an Express middleware) on a minimal request and response: resolves when it lets the request through. */
function decideOnce(limiter) {
  return new Promise((resolve, reject) => {
    const req = { ip: "127.0.0.1", originalUrl: "/bench", url: "/bench", method: "GET", headers: {}, get: () => undefined };
    const res = { headersSent: false, statusCode: 200, setHeader() {}, append() {}, once() { return res; },
      end: () => reject(new Error("the limiter answered: refused")) };
    limiter(req, res, (err) => (err ? reject(err) : resolve()));
  });
}

/** Each variant's limiter alone in this process: CPU µs per decision in interleaved rounds, and the ratios to the peer. */
async function limitersAlone(port) {
  const client = createClient({ url: `redis://127.0.0.1:${port}` });
  await client.connect();
  try {
    // validations off: they look at a real Express request (and run once anyway)
    const limiters = Object.fromEntries(VARIANTS.map((v) => [v, limiterOf(v, client, { validate: false })]));
    const run = async (limiter) => {
      let started = 0;
      const c0 = process.cpuUsage();
      await Promise.all(Array.from({ length: CONNECTIONS }, async () => {
        while (started++ < DECISIONS) await decideOnce(limiter);
      }));
      const c = process.cpuUsage(c0);
      return (c.user + c.system) / DECISIONS;
    };
    for (const v of VARIANTS) await run(limiters[v]); // warm-up
    const us = Object.fromEntries(VARIANTS.map((v) => [v, []]));
    for (let round = 0; round < ROUNDS; round++) {
      for (const v of VARIANTS.map((_, i) => VARIANTS[(i + round) % VARIANTS.length])) us[v].push(await run(limiters[v]));
    }
    const peer = us["rate-limit-redis"];
    console.log(`\nThe limiters alone (no HTTP, no Express): each middleware function called in one process, ${CONNECTIONS} decisions in flight, ${ROUNDS} interleaved rounds of ${DECISIONS}; the process's CPU per decision (the limiter and its Redis client)\n`);
    console.log("| variant | CPU µs/decision | vs peer |");
    console.log("|---|---|---|");
    for (const v of VARIANTS) {
      console.log(`| ${v} | ${median(us[v]).toFixed(2)} | ${median(us[v].map((x, i) => x / peer[i])).toFixed(2)} |`);
    }
  } finally {
    await client.quit();
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(s.length * p))];
};

const redisPort = await freePort();
const redisProc = spawn(process.env.REDIS_SERVER ?? "redis-server", ["--port", String(redisPort), "--bind", "127.0.0.1",
  "--save", "", "--appendonly", "no", "--loadmodule", MODULE], { stdio: "ignore" });
const servers = {};
try {
  for (let i = 0; i < 100 && !(await redis(redisPort, "PING").catch(() => "")).startsWith("+PONG"); i++) await sleep(100);
  for (const v of VARIANTS) {
    const p = spawn(process.execPath, [join(HERE, "app-server.mjs"), v, String(redisPort)], { stdio: ["pipe", "pipe", "inherit"] });
    const [line] = await once(createInterface({ input: p.stdout }), "line");
    servers[v] = { proc: p, url: String(line) };
  }
  for (const v of VARIANTS) await load(servers[v].url); // warm-up (JIT, connections)
  const results = Object.fromEntries(VARIANTS.map((v) => [v, { rps: [], p99: [], cmdUs: [], cpuUs: [], appUs: [] }]));
  for (let round = 0; round < ROUNDS; round++) {
    const order = VARIANTS.map((_, i) => VARIANTS[(i + round) % VARIANTS.length]);
    for (const v of order) {
      const before = await redisStats(redisPort);
      const app0 = processCpu(servers[v].proc.pid);
      const t0 = Date.now();
      const r = await load(servers[v].url);
      const secs = (Date.now() - t0) / 1000;
      const app1 = processCpu(servers[v].proc.pid);
      const after = await redisStats(redisPort);
      if (r.bad > 0) throw new Error(`${v}: ${r.bad} answers were not 200`);
      // top-level commands only: a script's own time includes the commands it calls
      let usec = 0;
      const seen = [];
      for (const [name, [calls, us]] of Object.entries(after.cmds)) {
        const d = calls - (before.cmds[name]?.[0] ?? 0);
        if (d > 0 && name !== "info") seen.push(`${name}=${d}`);
        if (TOP_LEVEL.test(name)) usec += us - (before.cmds[name]?.[1] ?? 0);
      }
      if (round === 0) console.error(`  ${v}: commands ${seen.join(" ")}`);
      const res = results[v];
      res.rps.push(r.n / secs);
      res.p99.push(pct(r.latencies, 0.99));
      res.cmdUs.push(usec / r.n);
      res.cpuUs.push(((after.cpu - before.cpu) * 1e6) / r.n);
      res.appUs.push(((app1 - app0) * 1e6) / r.n);
      console.error(`round ${round + 1} ${v}: ${(r.n / secs).toFixed(0)} req/s`);
    }
  }
  const peer = results["rate-limit-redis"];
  // per-round ratios to the peer, then their median
  const ratio = (v, field) => median(results[v][field].map((x, i) => x / peer[field][i]));
  console.log(`Express, GET /bench limited per client IP, ${ROUNDS} interleaved rounds of ${SECONDS} s, ${CONNECTIONS} connections; medians over the rounds (ratios: of each round's ratio)\n`);
  console.log("| variant | req/s | p99 ms | Redis command µs/decision | Redis CPU µs/decision | Express CPU µs/request | throughput vs peer | command µs vs peer | CPU µs vs peer | Express CPU vs peer |");
  console.log("|---|---|---|---|---|---|---|---|---|---|");
  for (const v of VARIANTS) {
    const r = results[v];
    console.log(`| ${v} | ${median(r.rps).toFixed(0)} | ${median(r.p99).toFixed(2)} | ${median(r.cmdUs).toFixed(2)} | ${median(r.cpuUs).toFixed(2)} | ${median(r.appUs).toFixed(0)} | ${ratio(v, "rps").toFixed(2)} | ${ratio(v, "cmdUs").toFixed(2)} | ${ratio(v, "cpuUs").toFixed(2)} | ${ratio(v, "appUs").toFixed(2)} |`);
  }
  console.log("");
  const peerCpu = median(peer.cpuUs);
  const outside = peerCpu - median(peer.cmdUs);
  for (const v of ["rl-store", "rl-middleware"]) {
    const cpu = ratio(v, "cpuUs");
    const cmd = ratio(v, "cmdUs");
    const thr = ratio(v, "rps");
    console.log(`${v}: Redis command time per decision ${cmd.toFixed(2)}x the peer's (target <= 0.5: ${cmd <= 0.5 ? "met" : "missed"}); throughput ${thr.toFixed(2)}x (target >= 1.0: ${thr >= 1 ? "met" : "missed"}); server CPU ${cpu.toFixed(2)}x`);
  }
  console.log(`Outside the command, one command per decision costs Redis ${outside.toFixed(2)} of the peer's ${peerCpu.toFixed(2)} µs CPU per decision (${(outside / peerCpu).toFixed(2)}x): a floor under the server CPU ratio of any store sending one command per decision`);
  await limitersAlone(redisPort);
} finally {
  for (const s of Object.values(servers)) s.proc.kill();
  redisProc.kill();
}
