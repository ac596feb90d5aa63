/**
 * The Express middleware: `rlExpress(options).route({...})` per route,
 * checked when it is made (a bad option throws, naming it).
 *
 * ```ts
 * const limits = rlExpress({ rl: forRedis(client) });
 * app.post("/v1/ledgers/:id/entries", limits.route({ rules: [...], locks: [...] }), handler);
 * ```
 */
import type { NextFunction, Request, RequestHandler, Response } from "express";

import { Engine, type HttpRequest, type LimiterOptions, type RouteConfig, type Verdict } from "./engine.js";

function setHeaders(res: import("node:http").ServerResponse, headers: Record<string, string>): void {
  for (const k in headers) res.setHeader(k, headers[k]!);
}

/**
 * Writes a verdict to a Node response: the refusal, or the fields and the
 * release at the response's end. True when the request is answered (or its
 * client already went away, its leases released at once): the handler
 * must not run.
 */
export function applyVerdict(v: Verdict, res: import("node:http").ServerResponse): boolean {
  const a = v.answer;
  if (res.destroyed || res.closed) {
    // the client left while rl decided: "close" was already emitted, so nothing would release later
    if (v.holds) void v.release();
    return true;
  }
  if (a.status !== null) {
    res.statusCode = a.status;
    setHeaders(res, a.headers);
    if (a.body) {
      res.setHeader("Content-Type", a.contentType!);
      res.end(JSON.stringify(a.body));
    } else {
      res.end();
    }
    return true;
  }
  if (!v.holds) {
    setHeaders(res, a.headers);
    return false;
  }
  let released = false;
  // "close" comes once the response is sent, or when the client went away first;
  // listened to before the headers are set, so an error there still releases
  res.once("close", () => {
    if (!released) {
      released = true;
      void v.release();
    }
  });
  setHeaders(res, a.headers);
  return false;
}

/** An Express request as the engine sees it (a class: one shape for every request; the path read only when an answer needs it). */
class ExpressRequest implements HttpRequest<Request> {
  constructor(readonly req: Request) {}

  get path(): string {
    return pathOf(this.req.originalUrl);
  }

  get ip(): string | undefined {
    return this.req.ip;
  }

  header(name: string): string | undefined {
    return this.req.get(name);
  }
}

/** A URL's path (the part before any query). */
export function pathOf(url: string): string {
  const q = url.indexOf("?");
  return q === -1 ? url : url.slice(0, q);
}

/** A limiter for an Express app: `route(config)` makes each route's middleware. */
export function rlExpress(options: LimiterOptions<Request>): {
  engine: Engine<Request>;
  route(config: RouteConfig<Request>): RequestHandler;
} {
  const engine = new Engine<Request>(options);
  let n = 0;
  return {
    engine,
    route(config) {
      const route = engine.route(config, `route #${++n}`);
      return (req: Request, res: Response, next: NextFunction) => {
        engine.decide(route, new ExpressRequest(req)).then((v) => {
          let answered: boolean;
          try {
            answered = applyVerdict(v, res);
          } catch (e) {
            // to Express's error handling, once: an exception here must not become an unhandled rejection
            next(e);
            return;
          }
          if (!answered) next();
        }, next);
      };
    },
  };
}
