/**
 * The same routes served by Express (rlExpress) and by Fastify
 * (rlFastify), so that every middleware test runs on both. A route's
 * handler answers {ok: true}, after `?hold=ms` (at most 10 s) or once the
 * test opens the gate named by `?gate=name` (at most 10 s).
 */
import type { Server as HttpServer } from "node:http";

import express, { type Request } from "express";
import Fastify, { type FastifyRequest } from "fastify";

import { rlExpress, rlFastify, type LimiterOptions, type RouteConfig } from "../src/index.js";
import { listening, } from "./http.js";
import { sleep } from "./servers.js";

/** A request of either framework, as a route's functions see it. */
export interface AnyReq {
  params: Record<string, string>;
  headers: Record<string, string | string[] | undefined>;
  query: unknown;
  body?: unknown;
}

export interface RouteDef {
  method: "GET" | "POST";
  /** Express-style path (`/ledgers/:id`). */
  path: string;
  limits: RouteConfig<AnyReq>;
}

/** Gates the handlers wait on. */
export class Gates {
  private readonly waiting = new Map<string, { promise: Promise<void>; open: () => void }>();
  /** Handlers that entered, by gate. */
  readonly entered = new Map<string, number>();

  wait(name: string): Promise<void> {
    this.entered.set(name, (this.entered.get(name) ?? 0) + 1);
    let g = this.waiting.get(name);
    if (!g) {
      let open!: () => void;
      const promise = new Promise<void>((r) => { open = r; });
      g = { promise, open };
      this.waiting.set(name, g);
    }
    return Promise.race([g.promise, sleep(10_000)]);
  }

  open(name: string): void {
    this.waiting.get(name)?.open();
    this.waiting.delete(name);
  }

  openAll(): void {
    for (const name of [...this.waiting.keys()]) this.open(name);
  }
}

async function handle(query: Record<string, unknown>, gates: Gates): Promise<{ ok: true }> {
  if (query["hold"]) await sleep(Math.min(Number(query["hold"]), 10_000));
  if (query["gate"]) await gates.wait(String(query["gate"]));
  return { ok: true };
}

export interface App {
  url: string;
  gates: Gates;
  close(): Promise<void>;
}

export type Framework = "express" | "fastify";
export const FRAMEWORKS: Framework[] = ["express", "fastify"];

/** Serves `routes` with `framework` on a free loopback port. */
export async function serve(framework: Framework, options: LimiterOptions<AnyReq>, routes: RouteDef[]): Promise<App> {
  const gates = new Gates();
  if (framework === "express") {
    const app = express();
    app.use(express.json());
    const limits = rlExpress(options as unknown as LimiterOptions<Request>);
    for (const r of routes) {
      const mw = limits.route(r.limits as unknown as RouteConfig<Request>);
      const h = async (req: Request, res: import("express").Response) => { res.json(await handle(req.query as Record<string, unknown>, gates)); };
      if (r.method === "GET") app.get(r.path, mw, h);
      else app.post(r.path, mw, h);
    }
    const http: HttpServer = app.listen(0, "127.0.0.1");
    const url = await listening(http);
    return { url, gates, close: async () => { gates.openAll(); http.closeAllConnections(); await new Promise((r) => http.close(r)); } };
  }
  const app = Fastify();
  await app.register(rlFastify, options as unknown as LimiterOptions<FastifyRequest>);
  for (const r of routes) {
    app.route({ method: r.method, url: r.path, config: { rl: r.limits as unknown as RouteConfig<FastifyRequest> },
      handler: async (req) => handle(req.query as Record<string, unknown>, gates) });
  }
  await app.listen({ port: 0, host: "127.0.0.1" });
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  return { url, gates, close: async () => { gates.openAll(); app.server.closeAllConnections(); await app.close(); } };
}
