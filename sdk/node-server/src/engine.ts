/**
 * The decision of a request under a route's limits, independent of the
 * framework (express.ts and fastify.ts adapt it): the Idempotency-Key
 * requirement, one rl command per rule (sent together: the clients
 * pipeline them), the strictest refusal, the compensation of the other
 * rules' charges when refused, shadow mode, and what Redis failing or
 * being slow does (a 503, or the local limiter, marked degraded).
 */
import { randomBytes, randomUUID } from "node:crypto";

import { RlConfigError } from "./args.js";
import { budget, RlUnavailableError, withTimeout, type Budget } from "./deadline.js";
import { decisionOf, type Lease, type RlCommands } from "./commands.js";
import { LocalLimiter } from "./fallback.js";
import {
  DEFAULT_RESPONSE_CONF, failClosed, idempotencyKeyRequired, leaseOutcome, rateOutcome, respond,
  type Answer, type Outcome, type RequestView, type ResponseConf, type RuleView,
} from "./responses.js";
import {
  checkRule, prepareRate, rateCommand, ruleKey, ruleView, type OnRedisFailure, type PreparedRate, type RuleConfig,
} from "./rules.js";

export { RlUnavailableError, withTimeout };

/** A per-resource mutual exclusion: one request at a time per key (a lease of 1), others refused at once (409 with Retry-After), never queued. */
export interface LockConfig<Req> {
  name: string;
  /** The resource (a ledger id...); undefined: no lock for this request. */
  key: (req: Req) => string | undefined;
  /** Seconds the lock lives if never released (a crashed process). Default 60. */
  ttl?: number;
  /** Seconds a holder usually takes (the refusal's Retry-After, at least 1). Default 1. */
  expected?: number;
}

/** What a route limits. */
export interface RouteConfig<Req> {
  rules?: RuleConfig<Req>[];
  locks?: LockConfig<Req>[];
  /** Refuse (400) a request without an Idempotency-Key header. */
  idempotencyKey?: boolean;
  /** Decide and report (onDecision) but never refuse, and add no rate-limit field. */
  shadow?: boolean;
  /** The route's default for its rules (default "closed": 503). */
  onRedisFailure?: OnRedisFailure;
  /** The route's Redis budget in ms (default: the limiter's). */
  timeoutMs?: number;
}

/** Options of a limiter (shared by its routes). */
export interface LimiterOptions<Req> {
  /** rl's typed commands (`forRedis(client)` / `forIoredis(client)`). */
  rl: RlCommands;
  /** First part of every key (default "rl"). */
  prefix?: string;
  /** Ms Redis has to answer before it counts as failed (default 250). */
  timeoutMs?: number;
  /** Fraction of a rule's budget the local limiter gives while Redis fails (default 0.25). */
  fallbackRatio?: number;
  /** Shadow mode for every route. */
  shadow?: boolean;
  /** The caller's tier (the problem body's quota_tier). */
  tier?: (req: Req) => string | undefined;
  /** Response options (problem_base, legacy headers, ...). */
  response?: Partial<ResponseConf>;
  /** Called once per decided request (logs, metrics, shadow-mode reports). */
  onDecision?: (event: DecisionEvent) => void;
}

/** What happened to a request. */
export interface DecisionEvent {
  decision: "allowed" | "refused" | "shadow_refused" | "failed_closed" | "degraded" | "idempotency_key_missing";
  status: number;
  policy?: string;
  path: string;
  requestId: string;
  error?: Error;
}

/** The framework's view of a request. */
export interface HttpRequest<Req> {
  req: Req;
  path: string;
  ip: string | undefined;
  header(name: string): string | undefined;
}

/** The verdict: answer now (status set) or proceed with `headers`, calling `release` when the response ends. */
export interface Verdict {
  answer: Answer;
  release: () => Promise<void>;
  /** Leases are held: `release` must be called when the response ends. */
  holds: boolean;
}

/** A rate rule made ready at start: its prepared command, the largest cost that can ever fit. */
export interface RatePlan<Req> {
  command: PreparedRate<Req>;
  cap: number;
}

/** A route checked and compiled at start. */
export interface CompiledRoute<Req> {
  rules: RuleConfig<Req>[];
  views: RuleView[];
  /** Per rule: its plan (undefined for a lease). */
  plans: (RatePlan<Req> | undefined)[];
  config: RouteConfig<Req>;
  /** The route's Redis budget. */
  budget: Budget;
}

/** A bad limiter or route option, named. */
function optionError(where: string, msg: string): never {
  throw new RlConfigError(`${where}: ${msg}`);
}

const NOTHING = async () => {};
const ONLY = (o: Outcome): Outcome[] => [o];
const ALL = (o: Outcome[]): Outcome[] => o;
const SAFE_ID = /^[\w.:-]{1,64}$/;

interface Entry<Req> {
  rule: RuleConfig<Req>; view: RuleView; value: string; cost: number;
  /** A rate rule's prepared command and the largest cost that can ever fit. */
  plan: RatePlan<Req> | undefined;
  /** The first key (a lease's key; the local limiter's key of a rate rule). */
  key: string;
  leaseId?: string;
}

/**
 * The request as the answer sees it. The path and the request id are read
 * on first use (an admitted request needs neither); a class, so that every
 * request's view shares one shape (an object literal with getters would
 * make a new one each time).
 */
class RequestState<Req> implements RequestView {
  private id: string | undefined;
  readonly nowMs = Date.now();

  constructor(private readonly http: HttpRequest<Req>, readonly tier: string | null) {}

  get path(): string {
    return this.http.path;
  }

  /** The request's X-Request-Id when it is safe to echo, else 32 random hex digits. */
  get requestId(): string {
    if (this.id === undefined) {
      const given = this.http.header("x-request-id");
      this.id = given && SAFE_ID.test(given) ? given : randomBytes(16).toString("hex");
    }
    return this.id;
  }
}

/** The framework-independent limiter. */
export class Engine<Req> {
  readonly conf: ResponseConf;
  private readonly rl: RlCommands;
  private readonly prefix: string;
  private readonly timeoutMs: number;
  private readonly ratio: number;
  private readonly local = new LocalLimiter();

  constructor(readonly options: LimiterOptions<Req>) {
    const o = options as Partial<LimiterOptions<Req>> | undefined;
    if (!o || typeof o !== "object") optionError("rl options", "must be an object");
    if (!o.rl || typeof o.rl.take !== "function") optionError("rl options", "rl must be forRedis(client) or forIoredis(client)");
    this.rl = o.rl;
    this.prefix = o.prefix ?? "rl";
    if (typeof this.prefix !== "string" || this.prefix.length === 0) optionError("rl options", "prefix must be a non-empty string");
    this.timeoutMs = o.timeoutMs ?? 250;
    if (!(typeof this.timeoutMs === "number" && this.timeoutMs > 0)) optionError("rl options", "timeoutMs must be a number of ms > 0");
    this.ratio = o.fallbackRatio ?? 0.25;
    if (!(typeof this.ratio === "number" && this.ratio > 0 && this.ratio <= 1)) optionError("rl options", "fallbackRatio must be in (0, 1]");
    this.conf = { ...DEFAULT_RESPONSE_CONF, ...(o.response ?? {}) };
    if (typeof this.conf.problemBase !== "string") optionError("rl options", "response.problemBase must be a string");
  }

  /** Checks a route's limits (errors name the option) and compiles them. */
  route(config: RouteConfig<Req>, where = "route"): CompiledRoute<Req> {
    if (!config || typeof config !== "object") optionError(where, "must be an object");
    const rules = [...(config.rules ?? [])];
    if (!Array.isArray(config.rules ?? [])) optionError(where, "rules must be an array");
    (config.locks ?? []).forEach((l, i) => {
      if (!l || typeof l.key !== "function") optionError(`${where}.locks[${i}]`, "key must be a function of the request");
      rules.push({ name: l.name, key: l.key, limiter: { kind: "lease", max: 1, ttl: l.ttl ?? 60, expected: l.expected ?? 1 },
        onRefusal: { status: 409 } });
    });
    const names = new Set<string>();
    rules.forEach((r, i) => {
      checkRule(r, `${where}.rules[${i}]`);
      if (names.has(r.name)) optionError(`${where}.rules[${i}]`, `name ${r.name} is used twice`);
      names.add(r.name);
    });
    if (config.timeoutMs !== undefined && !(typeof config.timeoutMs === "number" && config.timeoutMs > 0)) {
      optionError(where, "timeoutMs must be a number of ms > 0");
    }
    if (config.onRedisFailure !== undefined && !["closed", "local", "open"].includes(config.onRedisFailure)) {
      optionError(where, "onRedisFailure must be closed, local or open");
    }
    const plans = rules.map((r, i) => {
      const l = r.limiter;
      if (l.kind === "lease") return undefined;
      const cap = Math.min(l.kind === "bucket" ? l.burst : l.limit,
        ...(l.also ?? []).map((a) => (l.kind === "bucket" ? a.burst : a.limit)!));
      try {
        return { command: prepareRate(this.prefix, r), cap };
      } catch (e) {
        // the command's own checks (also periods and windows, box, offensesTtl, jitter): name the route and the rule
        if (e instanceof RlConfigError) optionError(`${where}.rules[${i}] (${r.name})`, `limiter.${e.message}`);
        throw e;
      }
    });
    return { rules, views: rules.map((r) => ruleView(r)), plans, config,
      budget: budget(config.timeoutMs ?? this.timeoutMs) };
  }

  /** Reports a decision to onDecision (the request id read only then). */
  private event(e: Omit<DecisionEvent, "path" | "requestId">, view: { path: string; requestId: string }): void {
    const report = this.options.onDecision;
    if (!report) return;
    try {
      report({ ...e, path: view.path, requestId: view.requestId });
    } catch {
      // a logging hook never breaks a request
    }
  }

  /** Decides a request. */
  async decide(route: CompiledRoute<Req>, http: HttpRequest<Req>): Promise<Verdict> {
    const view = new RequestState(http, this.options.tier?.(http.req) ?? null);
    if (route.config.idempotencyKey && !http.header("idempotency-key")) {
      this.event({ decision: "idempotency_key_missing", status: 400 }, view);
      return { answer: idempotencyKeyRequired(this.conf, view), release: NOTHING, holds: false };
    }
    const entries: Entry<Req>[] = [];
    for (let i = 0; i < route.rules.length; i++) {
      const rule = route.rules[i]!;
      const given = rule.key ? rule.key(http.req) : http.ip;
      if (given === undefined || given === null) continue;
      const value = String(given);
      const cost = typeof rule.cost === "function" ? rule.cost(http.req) : rule.cost ?? 1;
      if (!Number.isSafeInteger(cost) || cost < 0) {
        throw new RlConfigError(`${rule.name}: cost must be an integer >= 0, the function returned ${String(cost)}`);
      }
      const v = rule.limiter.kind === "quota" ? ruleView(rule) : route.views[i]!;
      const entry: Entry<Req> = { rule, view: v, value, cost, plan: route.plans[i],
        key: ruleKey(this.prefix, value, rule.name, rule.scope?.(http.req)) };
      if (rule.limiter.kind === "lease") entry.leaseId = randomUUID();
      entries.push(entry);
    }
    if (entries.length === 0) return { answer: { status: null, headers: {} }, release: NOTHING, holds: false };
    const shadow = route.config.shadow ?? this.options.shadow ?? false;
    const calls = entries.map((e) => this.call(e, http.req));
    let outcomes: Outcome[];
    try {
      // one rule (the usual case) needs no Promise.all
      outcomes = await (calls.length === 1 ? route.budget.run(calls[0]!, ONLY) : route.budget.run(Promise.all(calls), ALL));
    } catch (err) {
      // what the calls that did (or do, late) succeed took is given back: leases, points
      calls.forEach((c, i) => c.then((o) => {
        if (o.state === "allowed") void this.compensate([entries[i]!], http.req);
      }, NOTHING));
      return this.failed(route, entries, view, err as Error, shadow);
    }
    const answer = respond(this.conf, entries.map((e, i) => ({ rule: e.view, outcome: outcomes[i]! })), view);
    const granted = entries.filter((e, i) => e.leaseId && outcomes[i]!.state === "allowed");
    const release = () => this.release(granted);
    const holds = granted.length > 0;
    if (answer.status === null) {
      this.event({ decision: "allowed", status: 200 }, view);
      return { answer: shadow ? { status: null, headers: {} } : answer, release, holds };
    }
    const policy = entries[answer.refusedBy!]!.rule.name;
    if (shadow) {
      this.event({ decision: "shadow_refused", status: answer.status, policy }, view);
      return { answer: { status: null, headers: {} }, release, holds };
    }
    this.event({ decision: "refused", status: answer.status, policy }, view);
    // the other rules' charges are given back: a refused request spends nothing elsewhere
    void this.compensate(entries.filter((e, i) => i !== answer.refusedBy && outcomes[i]!.state === "allowed"),
      http.req);
    return { answer, release: NOTHING, holds: false };
  }

  /** One rule's command and its outcome. */
  private async call(e: Entry<Req>, req: Req): Promise<Outcome> {
    const l = e.rule.limiter;
    if (l.kind === "lease") {
      const key = e.key;
      const lease: Lease = await this.rl.lease.acquire(key, { max: l.max, ttl: l.ttl ?? 300, id: e.leaseId! });
      return leaseOutcome(e.view, lease, l.ttl ?? 300, l.expected ?? 1);
    }
    const { cap, command } = e.plan!;
    if (e.cost > cap) {
      // never fits: refused without Retry-After
      return { state: "refused", retryMs: null, strikes: null, level: 0, cost: e.cost,
        binding: { name: e.rule.name, limit: cap, remaining: 0, clamp: l.kind !== "bucket", ...(e.view.window !== undefined ? { window: e.view.window } : {}) } };
    }
    const b = command(req, e.key, e.value, e.cost);
    return rateOutcome(e.view, decisionOf(await this.rl.transport.send(b.keys, b.args, false), e.cost), e.cost);
  }

  private async release(entries: Entry<Req>[]): Promise<void> {
    await Promise.all(entries.map((e) => this.rl.lease.release(e.key, e.leaseId!)
      .catch(() => false)));
  }

  private async compensate(entries: Entry<Req>[], req: Req): Promise<void> {
    await Promise.all(entries.map(async (e) => {
      if (e.leaseId) return this.release([e]);
      if (e.cost === 0) return;
      const b = rateCommand(this.prefix, e.rule, req, e.value, e.cost, true);
      await this.rl.transport.send(b.keys, b.args, false).catch(() => undefined);
    }));
  }

  /** Redis failed or was too slow: 503 when a rule fails closed, else the local limiter. */
  private failed(route: CompiledRoute<Req>, entries: Entry<Req>[], view: { path: string; requestId: string;
    tier: string | null; nowMs: number }, error: Error, shadow: boolean): Verdict {
    const mode = (e: Entry<Req>) => e.rule.onRedisFailure ?? route.config.onRedisFailure ?? "closed";
    if (entries.some((e) => mode(e) === "closed")) {
      this.event({ decision: "failed_closed", status: 503, error }, view);
      return { answer: shadow ? { status: null, headers: {} } : failClosed(this.conf, view), release: NOTHING, holds: false };
    }
    const local = entries.filter((e) => mode(e) === "local" && (e.rule.limiter.kind === "bucket" || e.rule.limiter.kind === "window"));
    const decided = local.map((e) => {
      const l = e.rule.limiter as { kind: "bucket" | "window"; rate?: number; burst?: number; period?: number; limit?: number; window?: number };
      const burst = Math.max(Math.floor((l.burst ?? l.limit!) * this.ratio), 1);
      const rate = Math.max(Math.floor((l.rate ?? l.limit!) * this.ratio), 1);
      const period = (l.period ?? l.window ?? 60) * 1000;
      const t = this.local.take(e.key, rate, burst, period, Math.min(e.cost, burst));
      const name = `${e.rule.name}-degraded`;
      const rule: RuleView = { ...e.view, name, quota: rate, also: [] };
      const outcome: Outcome = { state: t.allowed ? "allowed" : "refused", retryMs: t.allowed ? null : t.retryMs,
        strikes: null, level: 0, cost: e.cost,
        binding: { name, limit: burst, remaining: t.remaining, resetMs: t.resetMs, window: period / 1000, clamp: false } };
      return { rule, outcome };
    });
    const answer = respond(this.conf, decided,
      { path: view.path, requestId: view.requestId, tier: view.tier, nowMs: view.nowMs, degraded: true });
    const refused = answer.status !== null;
    this.event({ decision: "degraded", status: answer.status ?? 200, error,
      ...(refused ? { policy: decided[answer.refusedBy!]!.rule.name } : {}) }, view);
    return { answer: shadow ? { status: null, headers: {} } : answer, release: NOTHING, holds: false };
  }
}
