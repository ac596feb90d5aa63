/**
 * A `fetch` wrapper (Node 18+ and browsers) that retries by the rl rules.
 * Each request is built once as a `Request` and every attempt sends a clone
 * of it: same method, URL, body, credentials and Idempotency-Key.
 */
import { systemClock, type Clock, type RandomSource } from "./clock.js";
import { Call, LockoutRegistry, retryPolicy, type EngineState, type ResponseView, type RetryPolicy } from "./engine.js";
import type { RateLimitInfo } from "./headers.js";
import type { Pacer } from "./pacer.js";

/** The caller's hook for a 409 (a concurrency conflict): polls the job that holds the resource and returns the response to give back, instead of submitting again. */
export type ConflictHook = (conflict: Response) => Response | Promise<Response>;

/** Options of a {@link RetryingFetch}. */
export interface RetryingFetchOptions {
  /** The fetch to send with (default: the global `fetch`). */
  fetch?: typeof fetch;
  /** Resolves relative URLs (Node has no page to resolve them against). */
  baseUrl?: string | URL;
  /** Headers added to every request (e.g. `X-Api-Key`) unless the request sets them. */
  headers?: HeadersInit;
  /** Changes to {@link DEFAULT_POLICY}. */
  policy?: Partial<RetryPolicy>;
  clock?: Clock;
  /** A number in [0, 1) (default `Math.random`). */
  random?: RandomSource;
  /** Share one between clients that use the same keys. */
  lockouts?: LockoutRegistry;
  pacer?: Pacer;
  /** Default 409 hook. */
  onConflict?: ConflictHook;
  /** Default: `crypto.randomUUID()`. */
  newIdempotencyKey?: () => string;
}

/** `fetch`'s init plus the per-call options. */
export interface RetryingInit extends RequestInit {
  /** Seconds this call may take in all, retries and waits included. */
  deadlineSeconds?: number | null;
  /** A key, or true to generate one (mutating requests only). */
  idempotencyKey?: string | boolean;
  /** This call's 409 hook. */
  onConflict?: ConflictHook;
  /** Points of the request, for the pacer (default 1). */
  cost?: number;
}

/** Problem bodies larger than this (bytes) are not parsed. */
const MAX_PROBLEM_BYTES = 64 * 1024;

/** The body of a clone of `resp`, or null when it is larger than {@link MAX_PROBLEM_BYTES} (then no more is read). */
async function boundedText(resp: Response): Promise<string | null> {
  const declared = resp.headers.get("Content-Length");
  if (declared !== null && !(Number(declared) <= MAX_PROBLEM_BYTES)) return null;
  const body = resp.clone().body;
  if (body === null) return "";
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > MAX_PROBLEM_BYTES) {
      // not awaited: a branch of a teed body settles its cancel only once the other branch is cancelled too
      reader.cancel().catch(() => undefined);
      return null;
    }
    chunks.push(value);
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.byteLength;
  }
  return new TextDecoder("utf-8", { fatal: true }).decode(all);
}

function view(resp: Response, sameOrigin: boolean): ResponseView {
  return {
    status: resp.status,
    header: (name) => resp.headers.get(name),
    sameOrigin,
    problem: async () => {
      if (!(resp.headers.get("Content-Type") ?? "").toLowerCase().includes("json")) return null;
      try {
        const text = await boundedText(resp);
        if (text === null) return null;
        const body: unknown = JSON.parse(text);
        return typeof body === "object" && body !== null && !Array.isArray(body)
          ? (body as Record<string, unknown>)
          : null;
      } catch {
        return null;
      }
    },
  };
}

/** A signal aborted when any of `signals` is (`AbortSignal.any` where the runtime has it). */
function anySignal(signals: AbortSignal[]): AbortSignal {
  if (typeof AbortSignal.any === "function") return AbortSignal.any(signals);
  const controller = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => controller.abort(s.reason), { once: true, signal: controller.signal });
  }
  return controller.signal;
}

/** The origin of `url`, or "" when it has none. */
function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "";
  }
}

/**
 * The client. `fetch(input, init)` has the signature of the global `fetch`
 * plus the options of {@link RetryingInit}; it resolves with the response
 * (any status it does not retry, a 409 through the hook) or rejects with a
 * {@link RateLimitError} for a throttled answer it gives up on. `rateLimit`
 * is the `RateLimit` state of the latest response that had one.
 */
export class RetryingFetch {
  /** The `RateLimit` / `RateLimit-Policy` fields of the latest response. */
  rateLimit: RateLimitInfo | null = null;
  readonly engine: EngineState;
  private readonly send: typeof fetch;
  private readonly baseUrl: string | URL | undefined;
  private readonly defaults: Headers;
  private readonly onConflict: ConflictHook | undefined;

  constructor(options: RetryingFetchOptions = {}) {
    const clock = options.clock ?? systemClock;
    this.send = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.baseUrl = options.baseUrl;
    this.defaults = new Headers(options.headers);
    this.onConflict = options.onConflict;
    const pacer = options.pacer ?? null;
    this.engine = {
      policy: retryPolicy(options.policy),
      clock,
      random: options.random ?? Math.random,
      lockouts: options.lockouts ?? new LockoutRegistry(clock),
      pacer,
      newIdempotencyKey: options.newIdempotencyKey ?? (() => globalThis.crypto.randomUUID()),
      observe: (info) => {
        if (info === null) return;
        this.rateLimit = info;
        pacer?.observe(info);
      },
    };
  }

  /** Sends a request, retrying by the policy (bound: may be passed around as a plain function). */
  readonly fetch = async (input: RequestInfo | URL, init: RetryingInit = {}): Promise<Response> => {
    const { deadlineSeconds, idempotencyKey, onConflict, cost, ...requestInit } = init;
    const url = typeof input === "string" && this.baseUrl !== undefined ? new URL(input, this.baseUrl) : input;
    let base = new Request(url, requestInit);
    this.defaults.forEach((value, name) => {
      if (!base.headers.has(name)) base.headers.set(name, value);
    });
    const { policy, clock } = this.engine;
    // fetch would send the API key on to another host; without the caller's say-so, redirects are not followed
    if (requestInit.redirect === undefined && policy.lockoutKeyHeaders.some((h) => base.headers.has(h))) {
      base = new Request(base, { redirect: "manual" });
    }
    const origin = originOf(base.url);
    const hook = onConflict ?? this.onConflict;
    const call = new Call(this.engine, base.method, new URL(base.url).pathname, base.headers, {
      deadlineSeconds: deadlineSeconds ?? null,
      hasConflictHook: hook !== undefined,
      origin,
      ...(idempotencyKey !== undefined ? { idempotencyKey } : {}),
      ...(cost !== undefined ? { cost } : {}),
    });
    const signal = base.signal;
    for (;;) {
      signal.throwIfAborted();
      await clock.sleep(call.beforeAttempt(), signal);
      signal.throwIfAborted();
      const left = call.remainingSeconds();
      const attempt = left === null
        ? base.clone()
        : new Request(base.clone(), { signal: anySignal([signal, AbortSignal.timeout(Math.ceil(Math.max(0, left) * 1000))]) });
      const resp = await this.send(attempt);
      const sameOrigin = resp.url === "" || originOf(resp.url) === origin;
      const step = await call.afterResponse(view(resp, sameOrigin), resp);
      if (step.action === "done") return resp;
      if (step.action === "conflict" && hook !== undefined) return hook(resp);
      await resp.body?.cancel();
      await clock.sleep(step.action === "wait" ? step.seconds : 0, signal);
    }
  };
}
