/** Test doubles: a fake clock, a scripted random source, a scripted server behind a fake `fetch`. */
import assert from "node:assert/strict";

import type { Clock } from "../../src/index.js";
import { RateLimitError, RetryingFetch, type RetryingFetchOptions } from "../../src/index.js";

/** Monotonic and wall time that only move when something sleeps (or `advance`); records sleeps. */
export class FakeClock implements Clock {
  now = 1000;
  sleeps: number[] = [];
  constructor(public wallNow = 1_700_000_000) {}
  monotonic(): number {
    return this.now;
  }
  wall(): number {
    return this.wallNow;
  }
  advance(seconds: number): void {
    this.now += seconds;
    this.wallNow += seconds;
  }
  sleep(seconds: number): Promise<void> {
    if (seconds > 0) {
      this.sleeps.push(seconds);
      this.advance(seconds);
    }
    return Promise.resolve();
  }
}

/** A random source returning `fraction` (so uniform(a, b) = a + fraction * (b - a)). */
export function fixedRandom(fraction: number): () => number {
  return () => fraction;
}

/** One scripted response. */
export interface Reply {
  status: number;
  headers?: Record<string, string>;
  /** An object is sent as JSON (problem+json for >= 400), a string as text. */
  body?: unknown;
}

export const OK: Reply = { status: 200, body: { ok: true } };

/** A gateway-like 429 (or `status`) with a problem body. */
export function throttled(retryAfter: string | null = "1", requestId = "req-1", headers: Record<string, string> = {},
                          status = 429): Reply {
  const h: Record<string, string> = { ...headers };
  if (retryAfter !== null) h["Retry-After"] = retryAfter;
  return { status, headers: h, body: { type: "https://api.example.com/problems/rate-limit-exceeded", status, request_id: requestId } };
}

/** What the scripted server received. */
export interface Sent {
  method: string;
  path: string;
  headers: Headers;
  body: string;
}

/** Answers with the scripted replies in order (the last one repeats). */
export class Server {
  sent: Sent[] = [];
  constructor(private readonly replies: Reply[]) {}

  readonly fetch = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const req = new Request(input, init);
    this.sent.push({ method: req.method, path: new URL(req.url).pathname, headers: req.headers, body: await req.text() });
    const r = this.replies[Math.min(this.sent.length - 1, this.replies.length - 1)]!;
    const headers = new Headers(r.headers);
    let body: string | null = null;
    if (typeof r.body === "object" && r.body !== null) {
      if (!headers.has("Content-Type")) headers.set("Content-Type", r.status >= 400 ? "application/problem+json" : "application/json");
      body = JSON.stringify(r.body);
    } else if (typeof r.body === "string") {
      body = r.body;
    }
    return new Response(r.status === 204 ? null : body, { status: r.status, headers });
  };
}

/** A client over a scripted server, with a fake clock and random source. */
export function driver(replies: Reply[], options: RetryingFetchOptions & { fraction?: number } = {}) {
  const server = new Server(replies);
  const clock = (options.clock as FakeClock | undefined) ?? new FakeClock();
  const randoms: number[] = [];
  const fraction = options.fraction ?? 1;
  const client = new RetryingFetch({
    baseUrl: "http://api.test",
    headers: { "X-Api-Key": "key-a" },
    random: () => {
      randoms.push(fraction);
      return fraction;
    },
    ...options,
    clock,
    fetch: server.fetch,
  });
  /** The response, or the error the call rejected with. */
  const call = async (path: string | Request, init: Parameters<RetryingFetch["fetch"]>[1] = {}): Promise<Response | Error> => {
    try {
      return await client.fetch(path, init);
    } catch (e) {
      return e as Error;
    }
  };
  return { server, clock, client, call };
}

/** `r` as the RateLimitError it must be. */
export function rateLimitError(r: Response | Error): RateLimitError {
  assert.ok(r instanceof RateLimitError, `expected a RateLimitError, got ${String(r)}`);
  return r;
}

/** The status of `r`, which must be a response. */
export function status(r: Response | Error): number {
  assert.ok(r instanceof Response, `expected a response, got ${String(r)}`);
  return r.status;
}
