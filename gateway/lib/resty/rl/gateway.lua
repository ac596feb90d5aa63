-- resty.rl.gateway: the whole request policy, independent of the front end.
--
-- A front end (resty.rl.nginx, the Kong plugin) creates one gateway per
-- configuration with new(conf) and calls, per request:
--   gw:access(req)         access phase: decide; refuse, or let through
--   gw:header_filter(req)  header filter: add the rate-limit fields
--   gw:log(req)            log phase: count, log, release leases, record
--                          failed logins (in a timer: no cosockets here)
-- `req` is the front end's adapter, a table of functions:
--   header(name), header_values(name) (every value of a header: a string,
--   a list for a repeated one, or nil), method(), path(), query_arg(name)
--   and body_arg(name)
--   (raw values of the query string and of a form or JSON body; a list for
--   a repeated argument; body_arg gives nil, "too_large" for a body the
--   front end cannot read), client_ip(), request_id(),
--   ctx() (per-request table), exit(status, body, headers),
--   set_header(name, value), status() (response status, log phase),
--   warn(message).
--
-- The per-request state lives in ctx() (ngx.ctx, kong.ctx.plugin). An
-- internal redirect (error_page, ngx.exec, try_files to a named location)
-- clears ngx.ctx: the log phase then finds no state, and the leases of the
-- request are only given back by their ttl. Keep such redirects off the
-- locations that run the gateway (see gateway/README.md).
--
-- This file holds the tier form's decisions (its RL.TAKE, leases, token
-- endpoint, degraded path, bodies); the plumbing around them (the request
-- state, shadow mode, fail-closed, the header filter, the log phase) is
-- resty.rl.phases, shared with the rule engine.

local config = require "resty.rl.config"
local policy = require "resty.rl.policy"
local store = require "resty.rl.store"
local headers = require "resty.rl.headers"
local problem = require "resty.rl.problem"
local fallback = require "resty.rl.fallback"
local metrics = require "resty.rl.metrics"
local limiters = require "resty.rl.limiters"
local deny = require "resty.rl.deny"
local phases = require "resty.rl.phases"
-- Everything the library may need is loaded now, with the front end (in
-- init_by_lua, by nginx's master): the workers run as another user, who
-- may not read the library's directory (a checkout in root's home).
local engine = require "resty.rl.engine"
require "resty.rl.cluster"

local _M = {}

local Gateway = {}
Gateway.__index = Gateway

local null = ngx.null

--- A gateway for `user_conf` (a partial configuration over the defaults
--- of resty.rl.config). Raises an error on an invalid configuration.
--- A configuration with `rules` (a rule policy) gets resty.rl.engine.
function _M.new(user_conf)
    local conf = config.build(user_conf)
    if conf.rules then
        return engine.new(conf)
    end
    -- per tier and per API key identity, what the allowed path needs of
    -- them, made once (see Gateway:tier_view, Gateway:bucket_keys)
    return setmetatable({ conf = conf, views = {},
                          keys = setmetatable({}, { __mode = "k" }) }, Gateway)
end

--- The rate policies of a tier, in the order of the RL.TAKE buckets.
local function tier_policies(tier_name, tier, suffix, key_budget, tenant_budget)
    suffix = suffix or ""
    -- the unit is points (cost-weighted requests): `qu` says so
    return {
        { name = tier_name .. "-key" .. suffix, quota = (key_budget or tier.key).rate,
          window = tier.period, unit = "points" },
        { name = tier_name .. "-tenant" .. suffix, quota = (tenant_budget or tier.tenant).rate,
          window = tier.period, unit = "points" },
    }
end

--- The request id (made on first use: an allowed request without
--- leases never needs one, and reading it costs a variable lookup).
local function request_id(req, state)
    local id = state.request_id
    if not id then
        id = req.request_id()
        state.request_id = id
    end
    return id
end

--- What every request of a tier needs, made once: its policies and
--- their RateLimit-Policy value.
function Gateway:tier_view(tier_name, tier)
    local v = self.views[tier_name]
    if not v then
        local policies = tier_policies(tier_name, tier)
        v = { policies = policies, policy_field = headers.policy(policies) }
        self.views[tier_name] = v
    end
    return v
end

--- The bucket keys of an identity (policy.bucket_keys), made once per
--- identity table (the static API keys' entries live as long as the
--- configuration).
function Gateway:bucket_keys(ident)
    local k = self.keys[ident]
    if not k then
        k = { policy.bucket_keys(self.conf, ident) }
        self.keys[ident] = k
    end
    return k[1], k[2]
end

--- Refuses the request with a problem+json body, or, in shadow mode, logs
--- what would have happened and lets it through without rate-limit fields.
function Gateway:refuse(req, state, status, kind, decision, fields)
    local conf = self.conf
    if not phases.refusing(conf, state, status, decision) then
        return
    end
    fields.instance = req.path()
    fields.request_id = request_id(req, state)
    return phases.exit(req, state, status, problem.CONTENT_TYPE,
        problem.encode(conf, kind, status, fields))
end

--- Refuses a request whose argument `name` has two different values (in
--- the query string and the body, or repeated): 400; or (`err`
--- "too_large") whose body is too large for the gateway to read: 413.
function Gateway:ambiguous(req, state, name, err)
    if err == "too_large" then
        return self:refuse(req, state, 413, "body-too-large", "invalid", {
            detail = "The request body is too large for the gateway to read its argument "
                .. name .. ", on which a rate limit depends; send a smaller body.",
        })
    end
    return self:refuse(req, state, 400, "ambiguous-argument", "invalid", {
        detail = "The argument " .. name .. " has more than one value (repeated, or "
            .. "different in the query string and the body), or is in a JSON body that "
            .. "does not decode; send it once.",
    })
end

--- Redis failed (error or slower than the budget): critical routes fail
--- closed with 503; the others go to the local limiter when `tier` is
--- known, or through when it is not.
function Gateway:redis_failed(req, state, err, tier, key, tenant_key)
    local conf = self.conf
    phases.redis_error(conf, state, err)
    if state.route.critical then
        local wait, detail = phases.fail_closed(conf, state, true)
        return self:refuse(req, state, 503, "rate-limiter-unavailable", "failed_closed", {
            detail = detail,
            retry_after_seconds = wait,
            recommended_backoff = problem.backoff(wait),
            quota_tier = state.tier_name or null,
        })
    end
    -- decided here, without Redis: the response says so
    headers.degraded(state.headers)
    if not tier then
        state.decision = "degraded_allowed"
        return
    end
    local key_budget = fallback.scaled(conf, tier.key)
    local tenant_budget = fallback.scaled(conf, tier.tenant)
    local buckets = {
        { name = "k:" .. key, rate = key_budget.rate, burst = key_budget.burst },
        { name = "t:" .. tenant_key, rate = tenant_budget.rate, burst = tenant_budget.burst },
    }
    local ok, b, remaining, wait_ms = fallback.take(conf, buckets, tier.period, state.cost)
    local policies = tier_policies(state.tier_name, tier, "-degraded", key_budget, tenant_budget)
    local bucket = buckets[b]
    headers.ratelimit(state.headers, conf, policies, {
        name = policies[b].name, limit = bucket.burst, remaining = remaining,
        reset_ms = math.ceil((bucket.burst - remaining) * tier.period * 1000 / bucket.rate),
    })
    state.policy = policies[b].name
    if ok then
        state.decision = "degraded_allowed"
        return
    end
    local secs = headers.seconds(wait_ms)
    state.retry_after = secs
    headers.retry_after(state.headers, wait_ms, false)
    return self:refuse(req, state, 429, "rate-limit-exceeded", "degraded_throttled", {
        detail = problem.rate_detail(state.tier_name, {
            scope = (b == 1 and "per-key" or "per-tenant") .. " (degraded, local)",
            rate = bucket.rate, burst = bucket.burst, period = tier.period }, state.cost, secs),
        retry_after_seconds = secs,
        recommended_backoff = problem.backoff(secs),
        quota_tier = state.tier_name,
        penalty_strikes_remaining = null,
        degraded = headers.DEGRADED_VALUE,
    })
end

--- Releases the leases this request holds, now (access phase).
function Gateway:release_now(state)
    local ok, err = store.release(self.conf, state.leases)
    if not ok then
        metrics.redis_error(self.conf, err)
    end
    state.leases = {}
end

--- A lease that is not free: refused with `status` (409, 429), to retry in
--- `secs`; at most `max` concurrent requests (`quota_tier`: the tier, or
--- "auth" for a login attempt).
function Gateway:busy(req, state, status, secs, detail, quota_tier, max)
    state.retry_after = secs
    return self:refuse(req, state, status, "concurrency-limit-exceeded", "conflict", {
        detail = detail,
        retry_after_seconds = secs,
        recommended_backoff = problem.backoff(secs),
        quota_tier = quota_tier,
        concurrency_limit = max,
    })
end

--- Acquires the route's leases in order; a full one refuses the request
--- (409 for a per-ledger lock, 429 for a tenant's concurrency) after giving
--- back those already held.
function Gateway:acquire_leases(req, state, ident, tier)
    local conf = self.conf
    for _, spec in ipairs(state.route.leases or {}) do
        local key, ambiguous = policy.lease_key(conf, ident, spec, req)
        if ambiguous then
            self:release_now(state)
            return self:ambiguous(req, state, spec.arg, ambiguous)
        end
        local max = policy.lease_max(spec, tier)
        -- recorded before the call: a timed-out ACQUIRE may have been
        -- granted, and releasing a lease that is not held is harmless
        phases.add_lease(state, { key = key, id = request_id(req, state) })
        local res, err = store.acquire(state.route.store_conf or conf, key, max, spec.ttl,
            state.request_id)
        if not res then
            -- Redis failed: the leases recorded so far are released after
            -- the response (a second call now would only add a timeout)
            return self:redis_failed(req, state, err)
        end
        if not res.granted then
            self:release_now(state)
            -- from the route's expected duration, never the lease ttl
            local retry_ms = limiters.lease_retry_ms(spec.ttl, spec.expected, res.retry_after_ms)
            local secs = headers.seconds(retry_ms)
            state.policy = spec.name
            headers.retry_after(state.headers, retry_ms, false)
            local per = spec.scope == "arg" and ("per " .. spec.arg) or "per tenant"
            return self:busy(req, state, spec.status, secs, string.format(
                "Tier %s: at most %d concurrent %s request(s) %s; retry in %d s.",
                state.tier_name, max, spec.name, per, secs), state.tier_name, max)
        end
    end
end

--- A penalty box answer (status -1 of RL.TAKE or RL.WINDOW); `box_lengths`
--- are the configured durations of levels 1..3 (tier.box or auth.box).
function Gateway:boxed(req, state, reply, decision, detail, box_lengths)
    local conf = self.conf
    local level, retry_ms = reply.box_level, reply.retry_after_ms
    local manual = retry_ms == nil
    local secs = not manual and headers.seconds(retry_ms) or nil
    state.retry_after, state.box_level = secs, level
    state.headers["X-Penalty-Box-Status"] = "Active-Lockout"
    -- the form depends on the box's length, not on the time left: a
    -- 1-hour box keeps its HTTP-date to the end
    local box_length = box_lengths[level] or 0
    headers.retry_after(state.headers, retry_ms, box_length >= conf.http_date_after)
    local status = manual and conf.manual_box_status or 429
    return self:refuse(req, state, status, "penalty-box-active", decision, {
        detail = detail .. (manual and " Locked until a manual review."
            or string.format(" Locked for %d s.", secs)),
        retry_after_seconds = secs or null,
        recommended_backoff = problem.backoff(secs),
        quota_tier = state.tier_name or "auth",
        penalty_strikes_remaining = 0,
        penalty_level = level,
        lockout_ends_at = not manual and problem.timestamp(headers.ends_at(retry_ms)) or null,
    })
end

--- Access phase: identifies the caller and the route, charges the cost
--- (RL.TAKE with the tenant bucket, strikes and boxes), takes the route's
--- leases, and refuses the request when the policy says so.
function Gateway:access(req)
    local conf = self.conf
    local state = phases.start(conf, req)
    local route = state.route
    if route.auth then
        return self:auth_access(req, state)
    end
    local ident, ambiguous = policy.identify(conf, req)
    if not ident then
        return self:refuse(req, state, 401, "unauthenticated", "unauthenticated", {
            detail = ambiguous and ("Send one API key: the " .. conf.identity.header
                .. " header came more than once.")
                or "Send a valid API key in the " .. conf.identity.header .. " header.",
        })
    end
    state.ident, state.tier_name = ident, ident.tier
    local tier = conf.tiers[ident.tier]
    local view = self:tier_view(ident.tier, tier)
    state.headers["RateLimit-Policy"] = view.policy_field
    state.cost = policy.cost(route, req)
    local key, tenant_key = self:bucket_keys(ident)
    -- the edge deny cache: a key known to be boxed (Redis said so within
    -- deny_cache.recheck seconds) is answered here
    local reply, err
    local box = deny.get(conf, key)
    if not box or box.stale then
        reply, err = store.take(route.store_conf or conf, key, tenant_key, tier, state.cost)
        if not reply and not box then
            return self:redis_failed(req, state, err, tier, key, tenant_key)
        end
    end
    if not reply then
        -- from the cache (a stale box too when Redis failed: still boxed)
        state.deny_cached = true
        reply = { status = -1, limit = tier.key.burst, remaining = 0, reset_ms = box.retry_ms,
                  retry_after_ms = box.retry_ms, box_level = box.level, strikes_remaining = 0,
                  binding = 0 }
        if err then
            phases.redis_error(conf, state, err)
        end
    elseif reply.status == -1 then
        deny.put(conf, key, reply.box_level, reply.retry_after_ms)
    elseif box then
        -- the stale cached box is gone from Redis (released)
        deny.forget(conf, key)
    end
    local status, binding = reply.status, reply.binding + 1
    local policies = view.policies
    state.policy, state.strikes_remaining = policies[binding].name, reply.strikes_remaining
    -- the reply is the binding RateLimit shows (no table of its own)
    reply.name = policies[binding].name
    headers.ratelimit(state.headers, conf, policies, reply, view.policy_field)
    if status == 1 or status == 2 then
        if state.route.leases then
            return self:acquire_leases(req, state, ident, tier)
        end
        return
    end
    if status == -1 then
        return self:boxed(req, state, reply, "boxed", string.format(
            "Tier %s: this API key is in the penalty box (level %d) after repeated throttling.",
            ident.tier, reply.box_level), tier.box)
    end
    local secs = headers.seconds(reply.retry_after_ms)
    state.retry_after = secs
    headers.retry_after(state.headers, reply.retry_after_ms, false)
    -- A warning once strikes count (an early retry), not on a refusal
    -- that only announces its Retry-After.
    if reply.strikes_remaining and reply.strikes_remaining < tier.strikes.threshold then
        state.headers["X-Penalty-Box-Status"] = "Warning"
    end
    local budget = binding == 1 and tier.key or tier.tenant
    return self:refuse(req, state, 429, "rate-limit-exceeded", "throttled", {
        detail = problem.rate_detail(ident.tier, {
            scope = binding == 1 and "per-key" or "per-tenant", rate = budget.rate,
            burst = budget.burst, period = tier.period }, state.cost, secs),
        retry_after_seconds = secs,
        recommended_backoff = problem.backoff(secs),
        quota_tier = ident.tier,
        penalty_strikes_remaining = reply.strikes_remaining or null,
    })
end

--- Access phase of the token endpoint. The subject comes from the body
--- (`auth.subject_arg`) or the `Authorization: Basic` user, never from the
--- query string alone (an ambiguous one is refused with 400). Without a
--- subject only the client IP's window applies. With one, the attempt
--- first takes the subject's attempt lease (one attempt in flight per
--- subject: a concurrent one gets 429 with a short Retry-After), held
--- until the outcome is recorded after the response. Then the failure
--- windows are probed (COST 0, nothing written); a lockout, or a window
--- with no failure left, refuses the attempt (the latter records it as a
--- failure, which trips the lockout). Everything else goes upstream; its
--- 401/403 is recorded after the response, before the lease is released.
function Gateway:auth_access(req, state)
    local conf = self.conf
    local auth = conf.auth
    -- the route's Redis budget (routes[i].timeout_ms), else redis.timeout_ms
    local sconf = state.route.store_conf or conf
    local subject, ambiguous = policy.auth_subject(req, auth.subject_arg)
    if ambiguous then
        return self:ambiguous(req, state, auth.subject_arg, ambiguous)
    end
    local ip = conf.client_ip_header and policy.header(req, conf.client_ip_header)
        or req.client_ip()
    local subject_key, attempt_key, ip_key = policy.auth_keys(conf, subject, ip)
    local windows, policies = {}, {}
    if subject_key then
        windows[1] = { subject_key, auth.subject }
        policies[1] = { name = "auth-subject", quota = auth.subject.limit,
                        window = auth.subject.window }
    end
    windows[#windows + 1] = { ip_key, auth.ip }
    policies[#policies + 1] = { name = "auth-ip", quota = auth.ip.limit, window = auth.ip.window }
    state.auth = { windows = windows, subject = subject, ip = ip }
    state.headers["RateLimit-Policy"] = headers.policy(policies)
    if attempt_key then
        phases.add_lease(state, { key = attempt_key, id = request_id(req, state) })
        local res, err = phases.acquire_waiting(sconf, attempt_key, auth.attempt_ttl,
            state.request_id, auth.attempt_wait_ms)
        if not res then
            -- released after the response, as any lease of a Redis failure
            return self:redis_failed(req, state, err)
        end
        if not res.granted then
            state.leases = {}
            local wait = auth.busy_retry_after
            state.headers["Retry-After"] = tostring(wait)
            return self:busy(req, state, 429, wait,
                "Another attempt for this client is in progress; retry in " .. wait .. " s.",
                "auth", 1)
        end
    end
    local replies, err = store.auth_windows(sconf, windows, 0)
    if not replies then
        return self:redis_failed(req, state, err)
    end
    local exhausted = {}
    for i, r in ipairs(replies) do
        if r.status == 0 or (r.status == 1 and r.remaining <= 0) then
            exhausted[#exhausted + 1] = i
        end
    end
    if #exhausted > 0 then
        local rec = {}
        for j, i in ipairs(exhausted) do
            rec[j] = windows[i]
        end
        local recorded
        recorded, err = store.auth_windows(sconf, rec, 1)
        if not recorded then
            return self:redis_failed(req, state, err)
        end
        for j, i in ipairs(exhausted) do
            replies[i] = recorded[j]
        end
    end
    -- the binding window: the strictest box (resty.rl.deny.stricter: the
    -- highest level, then the latest end), else the one with fewest
    -- failures left
    local b, box = 1, nil
    for i, r in ipairs(replies) do
        if r.status == -1 then
            local this = { level = r.box_level, retry_ms = r.retry_after_ms }
            if not box or deny.stricter(this, box) then
                b, box = i, this
            end
        elseif not box and r.remaining < replies[b].remaining then
            b = i
        end
    end
    local r = replies[b]
    state.policy = policies[b].name
    local binding = {
        name = policies[b].name, limit = r.limit, remaining = r.status == -1 and 0 or r.remaining,
        reset_ms = r.reset_ms, window = policies[b].window,
    }
    state.auth.binding, state.auth.policies = binding, policies
    headers.ratelimit(state.headers, conf, policies, binding)
    if r.status == -1 or r.status == 0 then
        -- refused here: nothing to record later
        self:release_now(state)
    end
    if r.status == -1 then
        return self:boxed(req, state, r, "locked_out", "Too many failed attempts.", auth.box)
    end
    if r.status == 0 then
        local secs = headers.seconds(r.retry_after_ms)
        state.retry_after = secs
        headers.retry_after(state.headers, r.retry_after_ms, false)
        return self:refuse(req, state, 429, "rate-limit-exceeded", "throttled", {
            detail = "Too many failed attempts; retry in " .. secs .. " s.",
            retry_after_seconds = secs,
            recommended_backoff = problem.backoff(secs),
            quota_tier = "auth",
            penalty_strikes_remaining = r.strikes_remaining or null,
        })
    end
    state.auth.pending = true
end

--- Header filter: adds the rate-limit fields decided in the access phase.
function Gateway:header_filter(req)
    local state = req.ctx().rl
    -- shadow mode is invisible to clients
    if not state or self.conf.shadow then
        return
    end
    local auth = state.auth
    if auth and auth.pending and auth.binding and self.conf.auth.fail_set[req.status()] then
        -- this failure is recorded after the response: `r` says what the
        -- next attempt will see, and the failure counts a whole window
        local b = auth.binding
        headers.ratelimit(state.headers, self.conf, auth.policies, {
            name = b.name, limit = b.limit, remaining = math.max(b.remaining - 1, 0),
            reset_ms = b.window * 1000, window = b.window,
        })
    end
    phases.send_headers(req, state)
end

--- Work after the response, in a timer (the log phase cannot use
--- cosockets): record a failed login, then release the leases (the login
--- attempt lease last, so that the next attempt sees this failure). A
--- premature run (the worker is exiting) does the same work: cosockets
--- still work there, and a lease left behind would block until its ttl.
local function after_response(_premature, conf, leases, record, warn)
    if record then
        local ok, err = store.auth_windows(conf, record, 1)
        if not ok then
            phases.work_failed(conf, warn, "failed login not recorded", err)
        end
    end
    if #leases > 0 then
        local ok, err = store.release(conf, leases)
        if not ok then
            phases.work_failed(conf, warn, "lease release failed", err)
        end
    end
end

-- The fields of the event line of a refused request (resty.rl.phases.log).
local function event(req, state, status)
    local ident = state.ident or {}
    return {
        request_id = request_id(req, state),
        decision = state.decision,
        would_be = state.would_be,
        route = state.route.name,
        tenant = ident.tenant,
        key_id = ident.key_id,
        tier = state.tier_name or nil,
        cost = state.cost or nil,
        status = status,
        policy = state.policy or nil,
        retry_after = state.retry_after,
        box_level = state.box_level,
        strikes_remaining = state.strikes_remaining or nil,
        redis_error = state.redis_error,
        deny_cache = state.deny_cached,
        -- token endpoint: who was refused (a client id is no secret)
        subject = state.auth and state.auth.subject,
        client_ip = state.auth and state.auth.ip,
    }
end

--- Log phase: counts the decision, writes one structured log line for a
--- refused (or, in shadow mode, would-be refused) request, and schedules
--- the lease release and the failed-login record.
function Gateway:log(req)
    local conf = self.conf
    local state, status = phases.log(conf, req, event)
    if not state then
        return
    end
    local record = state.auth and state.auth.pending and conf.auth.fail_set[status]
        and state.auth.windows or nil
    if #state.leases > 0 or record then
        phases.after(req, after_response, conf, state.leases, record, req.warn)
    end
end

return _M
