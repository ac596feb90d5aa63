/**
 * The Fastify plugin: register it once, then give each route its limits
 * in `config.rl`; every route's limits are checked when the route is
 * added (a bad option throws from `app.get(...)` / `app.route(...)`, or
 * fails `ready()` for a route added in a plugin, naming the route and the
 * option). Await the registration before adding routes: a route added
 * before the plugin has loaded is not limited.
 *
 * ```ts
 * await app.register(rlFastify, { rl: forIoredis(redis) });
 * app.post("/v1/ledgers/:id/reconcile", { config: { rl: { locks: [...] } } }, handler);
 * ```
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import fp from "fastify-plugin";

import { Engine, type HttpRequest, type LimiterOptions, type RouteConfig } from "./engine.js";
import { applyVerdict, pathOf } from "./express.js";

declare module "fastify" {
  interface FastifyContextConfig {
    /** This route's rl limits. */
    rl?: RouteConfig<FastifyRequest>;
  }
  interface FastifyInstance {
    /** The rl engine of the plugin. */
    rl: Engine<FastifyRequest>;
  }
}

/** The plugin's options: a limiter's, and the hook that decides (preHandler: after the body is parsed, so a cost may read it). */
export interface RlFastifyOptions extends LimiterOptions<FastifyRequest> {
  hook?: "onRequest" | "preHandler";
}

/** A Fastify request as the engine sees it (a class: one shape for every request; the path read only when an answer needs it). */
class FastifyHttp implements HttpRequest<FastifyRequest> {
  constructor(readonly req: FastifyRequest) {}

  get path(): string {
    return pathOf(this.req.url);
  }

  get ip(): string {
    return this.req.ip;
  }

  header(name: string): string | undefined {
    const h = this.req.headers[name.toLowerCase()];
    return Array.isArray(h) ? h[0] : h;
  }
}

async function plugin(app: FastifyInstance, options: RlFastifyOptions): Promise<void> {
  const engine = new Engine<FastifyRequest>(options);
  const hook = options.hook ?? "preHandler";
  if (hook !== "onRequest" && hook !== "preHandler") throw new Error(`rl options: hook must be onRequest or preHandler, got ${String(hook)}`);
  app.decorate("rl", engine);
  app.addHook("onRoute", (routeOptions) => {
    const config = (routeOptions.config as { rl?: RouteConfig<FastifyRequest> } | undefined)?.rl;
    if (!config) return;
    const route = engine.route(config, `route ${String(routeOptions.method)} ${routeOptions.url}`);
    const decide = async (request: FastifyRequest, reply: FastifyReply) => {
      const v = await engine.decide(route, new FastifyHttp(request));
      if (applyVerdict(v, reply.raw)) {
        reply.hijack();
      }
    };
    const existing = routeOptions[hook];
    routeOptions[hook] = existing ? [decide, ...(Array.isArray(existing) ? existing : [existing])] as never : decide as never;
  });
}

/** The Fastify plugin (fastify-plugin: its hooks apply to the routes of the app that registers it). */
export const rlFastify = fp(plugin, { fastify: "5.x", name: "@rl/server" });
