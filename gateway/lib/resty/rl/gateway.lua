-- resty.rl.gateway: the whole request policy, independent of the front end.
--
-- A front end (resty.rl.nginx, the Kong plugin) creates one gateway per
-- configuration with new(conf) and calls, per request:
--   gw:access(req)         access phase: decide; refuse, or let through
--   gw:header_filter(req)  header filter: add the rate-limit fields
--   gw:log(req)            log phase: count, log, release leases, record
--                          failed logins (in a timer: no cosockets here)
-- `req` is the front end's adapter, a table of functions:
--   header(name), method(), path(), arg(name) (query string, then a form
--   or JSON body; raw values), client_ip(), request_id(),
--   ctx() (per-request table), exit(status, body, headers),
--   set_header(name, value), status() (response status, log phase),
--   warn(message).

local config = require "resty.rl.config"
local policy = require "resty.rl.policy"
local store = require "resty.rl.store"
local headers = require "resty.rl.headers"
local problem = require "resty.rl.problem"
local fallback = require "resty.rl.fallback"
local metrics = require "resty.rl.metrics"
local cjson = require "cjson.safe"

local _M = {}

local Gateway = {}
Gateway.__index = Gateway

local null = ngx.null

--- A gateway for `user_conf` (a partial configuration over the defaults
--- of resty.rl.config). Raises an error on an invalid configuration.
function _M.new(user_conf)
    return setmetatable({ conf = config.build(user_conf) }, Gateway)
end

-- The rate policies of a tier, in the order of the RL.TAKE buckets.
local function tier_policies(tier_name, tier, suffix, key_budget, tenant_budget)
    suffix = suffix or ""
    return {
        { name = tier_name .. "-key" .. suffix, quota = (key_budget or tier.key).rate,
          window = tier.period },
        { name = tier_name .. "-tenant" .. suffix, quota = (tenant_budget or tier.tenant).rate,
          window = tier.period },
    }
end

-- Refuses the request with a problem+json body, or, in shadow mode, logs
-- what would have happened and lets it through without rate-limit fields.
function Gateway:refuse(req, st, status, kind, decision, fields)
    local conf = self.conf
    st.status_would_be = status
    if conf.shadow then
        st.decision, st.would_be = "shadow_allowed", decision
        st.headers = {}
        return
    end
    st.decision = decision
    fields.instance = st.path
    fields.request_id = st.request_id
    st.headers["Content-Type"] = problem.CONTENT_TYPE
    return req.exit(status, problem.encode(conf, kind, status, fields), st.headers)
end

-- Redis failed (error or slower than the budget): critical routes fail
-- closed with 503; the others go to the local limiter when `tier` is
-- known, or through when it is not.
function Gateway:redis_failed(req, st, err, tier, key, tenant_key)
    local conf = self.conf
    metrics.redis_error(conf, err)
    st.redis_error = err
    if st.route.critical then
        local wait = conf.fail_closed_retry_after
        -- the static policies stay; there is no live RateLimit to give
        st.headers = { ["RateLimit-Policy"] = st.headers["RateLimit-Policy"],
                       ["Retry-After"] = tostring(wait) }
        st.retry_after = wait
        return self:refuse(req, st, 503, "rate-limiter-unavailable", "failed_closed", {
            detail = "The rate limiter is unavailable and this route fails closed; retry in "
                .. wait .. " s.",
            retry_after_seconds = wait,
            recommended_backoff = problem.backoff(wait),
            quota_tier = st.tier_name or null,
        })
    end
    if not tier then
        st.decision = "degraded_allowed"
        return
    end
    local kb, tb = fallback.scaled(conf, tier.key), fallback.scaled(conf, tier.tenant)
    local buckets = {
        { name = "k:" .. key, rate = kb.rate, burst = kb.burst },
        { name = "t:" .. tenant_key, rate = tb.rate, burst = tb.burst },
    }
    local ok, b, remaining, wait_ms = fallback.take(conf, buckets, tier.period, st.cost)
    local pols = tier_policies(st.tier_name, tier, "-degraded", kb, tb)
    local bk = buckets[b]
    headers.ratelimit(st.headers, conf, pols, {
        name = pols[b].name, limit = bk.burst, remaining = remaining,
        reset_ms = math.ceil((bk.burst - remaining) * tier.period * 1000 / bk.rate),
    })
    st.policy = pols[b].name
    if ok then
        st.decision = "degraded_allowed"
        return
    end
    local secs = headers.seconds(wait_ms)
    st.retry_after = secs
    headers.retry_after(st.headers, wait_ms, false)
    return self:refuse(req, st, 429, "rate-limit-exceeded", "degraded_throttled", {
        detail = problem.rate_detail(st.tier_name, {
            scope = (b == 1 and "per-key" or "per-tenant") .. " (degraded, local)",
            rate = bk.rate, burst = bk.burst, period = tier.period }, st.cost, secs),
        retry_after_seconds = secs,
        recommended_backoff = problem.backoff(secs),
        quota_tier = st.tier_name,
        penalty_strikes_remaining = null,
    })
end

-- Releases the leases this request holds, now (access phase).
function Gateway:release_now(st)
    local ok, err = store.release(self.conf, st.leases)
    if not ok then
        metrics.redis_error(self.conf, err)
    end
    st.leases = {}
end

-- Acquires the route's leases in order; a full one refuses the request
-- (409 for a per-ledger lock, 429 for a tenant's concurrency) after giving
-- back those already held.
function Gateway:acquire_leases(req, st, ident, tier)
    local conf = self.conf
    for _, spec in ipairs(st.route.leases or {}) do
        local key = policy.lease_key(conf, ident, spec, req)
        local max = policy.lease_max(spec, tier)
        local res, err = store.acquire(conf, key, max, spec.ttl, st.request_id)
        if not res then
            self:release_now(st)
            return self:redis_failed(req, st, err)
        end
        if not res.granted then
            self:release_now(st)
            local secs = headers.seconds(res.retry_after_ms)
            st.retry_after = secs
            st.policy = spec.name
            headers.retry_after(st.headers, res.retry_after_ms, false)
            local per = spec.scope == "arg" and ("per " .. spec.arg) or "per tenant"
            return self:refuse(req, st, spec.status, "concurrency-limit-exceeded", "conflict", {
                detail = string.format(
                    "Tier %s: at most %d concurrent %s request(s) %s; retry in %d s.",
                    st.tier_name, max, spec.name, per, secs),
                retry_after_seconds = secs,
                recommended_backoff = problem.backoff(secs),
                quota_tier = st.tier_name,
                concurrency_limit = max,
            })
        end
        st.leases[#st.leases + 1] = { key = key, id = st.request_id }
    end
end

-- A penalty box answer (status -1 of RL.TAKE or RL.WINDOW).
function Gateway:boxed(req, st, reply, decision, detail)
    local conf = self.conf
    local level, retry_ms = reply[6], reply[5]
    local manual = retry_ms < 0
    local secs = not manual and headers.seconds(retry_ms) or nil
    st.retry_after, st.box_level = secs, level
    st.headers["X-Penalty-Box-Status"] = "Active-Lockout"
    headers.retry_after(st.headers, retry_ms, secs and secs >= conf.http_date_after)
    local status = manual and conf.manual_box_status or 429
    return self:refuse(req, st, status, "penalty-box-active", decision, {
        detail = detail .. (manual and " Locked until a manual review."
            or string.format(" Locked for %d s.", secs)),
        retry_after_seconds = secs or null,
        recommended_backoff = problem.backoff(secs),
        quota_tier = st.tier_name or "auth",
        penalty_strikes_remaining = 0,
        penalty_level = level,
        lockout_ends_at = secs and problem.timestamp(ngx.time() + secs) or null,
    })
end

--- Access phase: identifies the caller and the route, charges the cost
--- (RL.TAKE with the tenant bucket, strikes and boxes), takes the route's
--- leases, and refuses the request when the policy says so.
function Gateway:access(req)
    local conf = self.conf
    local path = req.path()
    local route = policy.match_route(conf, req.method(), path)
    local st = { route = route, path = path, request_id = req.request_id(), headers = {},
                 leases = {}, decision = "allowed" }
    req.ctx().rl = st
    if route.auth then
        return self:auth_access(req, st)
    end
    local ident = policy.identify(conf, req)
    if not ident then
        return self:refuse(req, st, 401, "unauthenticated", "unauthenticated", {
            detail = "Send a valid API key in the " .. conf.identity.header .. " header.",
        })
    end
    st.ident, st.tier_name = ident, ident.tier
    local tier = conf.tiers[ident.tier]
    st.headers["RateLimit-Policy"] = headers.policy(tier_policies(ident.tier, tier))
    st.cost = policy.cost(route, req)
    local key, tenant_key = policy.bucket_keys(conf, ident)
    local reply, err = store.take(conf, key, tenant_key, tier, st.cost)
    if not reply then
        return self:redis_failed(req, st, err, tier, key, tenant_key)
    end
    local status, binding = reply[1], reply[8] + 1
    local pols = tier_policies(ident.tier, tier)
    st.policy, st.strikes_remaining = pols[binding].name, reply[7]
    headers.ratelimit(st.headers, conf, pols, {
        name = pols[binding].name, limit = reply[2], remaining = reply[3], reset_ms = reply[4],
    })
    if status == 1 or status == 2 then
        return self:acquire_leases(req, st, ident, tier)
    end
    if status == -1 then
        return self:boxed(req, st, reply, "boxed", string.format(
            "Tier %s: this API key is in the penalty box (level %d) after repeated throttling.",
            ident.tier, reply[6]))
    end
    local secs = headers.seconds(reply[5])
    st.retry_after = secs
    headers.retry_after(st.headers, reply[5], false)
    if reply[7] >= 0 then
        st.headers["X-Penalty-Box-Status"] = "Warning"
    end
    local budget = binding == 1 and tier.key or tier.tenant
    return self:refuse(req, st, 429, "rate-limit-exceeded", "throttled", {
        detail = problem.rate_detail(ident.tier, {
            scope = binding == 1 and "per-key" or "per-tenant", rate = budget.rate,
            burst = budget.burst, period = tier.period }, st.cost, secs),
        retry_after_seconds = secs,
        recommended_backoff = problem.backoff(secs),
        quota_tier = ident.tier,
        penalty_strikes_remaining = reply[7],
    })
end

--- Access phase of the token endpoint: probes the failed-login windows of
--- the subject and the client IP (COST 0, nothing written); a lockout, or
--- a window with no failure left, refuses the attempt (the latter records
--- it as a failure, which trips the lockout). Everything else goes to the
--- upstream; its 401/403 is counted in the log phase.
function Gateway:auth_access(req, st)
    local conf = self.conf
    local a = conf.auth
    local subject = policy.arg(req, a.subject_arg)
    local ip = conf.client_ip_header and req.header(conf.client_ip_header) or req.client_ip()
    local skey, ikey = policy.auth_keys(conf, subject, ip)
    local windows = { { skey, a.subject }, { ikey, a.ip } }
    st.auth = { windows = windows, subject = subject, ip = ip }
    local pols = {
        { name = "auth-subject", quota = a.subject.limit, window = a.subject.window },
        { name = "auth-ip", quota = a.ip.limit, window = a.ip.window },
    }
    st.headers["RateLimit-Policy"] = headers.policy(pols)
    local replies, err = store.auth_windows(conf, windows, 0)
    if not replies then
        return self:redis_failed(req, st, err)
    end
    local exhausted = {}
    for i, r in ipairs(replies) do
        if r[1] == 0 or (r[1] == 1 and r[3] <= 0) then
            exhausted[#exhausted + 1] = i
        end
    end
    if #exhausted > 0 then
        local rec = {}
        for j, i in ipairs(exhausted) do
            rec[j] = windows[i]
        end
        local recorded
        recorded, err = store.auth_windows(conf, rec, 1)
        if not recorded then
            return self:redis_failed(req, st, err)
        end
        for j, i in ipairs(exhausted) do
            replies[i] = recorded[j]
        end
    end
    local b = replies[2][3] < replies[1][3] and 2 or 1
    for i, r in ipairs(replies) do
        if r[1] == -1 then
            b = i
            break
        end
    end
    local r = replies[b]
    st.policy = pols[b].name
    headers.ratelimit(st.headers, conf, pols, {
        name = pols[b].name, limit = r[2], remaining = r[1] == -1 and 0 or r[3],
        reset_ms = r[4],
    })
    if r[1] == -1 then
        return self:boxed(req, st, r, "locked_out", "Too many failed attempts.")
    end
    if r[1] == 0 then
        local secs = headers.seconds(r[5])
        st.retry_after = secs
        headers.retry_after(st.headers, r[5], false)
        return self:refuse(req, st, 429, "rate-limit-exceeded", "throttled", {
            detail = "Too many failed attempts; retry in " .. secs .. " s.",
            retry_after_seconds = secs,
            recommended_backoff = problem.backoff(secs),
            quota_tier = "auth",
            penalty_strikes_remaining = r[7],
        })
    end
    st.auth.pending = true
end

--- Header filter: adds the rate-limit fields decided in the access phase.
function Gateway:header_filter(req)
    local st = req.ctx().rl
    -- shadow mode is invisible to clients
    if not st or self.conf.shadow then
        return
    end
    for k, v in pairs(st.headers) do
        req.set_header(k, v)
    end
end

-- Work after the response, in a timer (the log phase cannot use
-- cosockets): release leases, record a failed login.
local function after_response(premature, conf, leases, record, warn)
    if premature then
        return
    end
    if #leases > 0 then
        local ok, err = store.release(conf, leases)
        if not ok then
            metrics.redis_error(conf, err)
            warn("rl: lease release failed: " .. tostring(err))
        end
    end
    if record then
        local ok, err = store.auth_windows(conf, record, 1)
        if not ok then
            metrics.redis_error(conf, err)
            warn("rl: failed login not recorded: " .. tostring(err))
        end
    end
end

local QUIET = { allowed = true, degraded_allowed = true }

--- Log phase: counts the decision, writes one structured log line for a
--- refused (or, in shadow mode, would-be refused) request, and schedules
--- the lease release and the failed-login record.
function Gateway:log(req)
    local conf = self.conf
    local st = req.ctx().rl
    if not st then
        return
    end
    local status = req.status()
    metrics.decision(conf, st.decision, st.route.name, st.tier_name)
    if not QUIET[st.decision] then
        local ident = st.ident or {}
        req.warn("rl_event " .. (cjson.encode({
            request_id = st.request_id,
            decision = st.decision,
            would_be = st.would_be,
            route = st.route.name,
            tenant = ident.tenant,
            key_id = ident.key_id,
            tier = st.tier_name,
            cost = st.cost,
            status = status,
            policy = st.policy,
            retry_after = st.retry_after,
            box_level = st.box_level,
            strikes_remaining = st.strikes_remaining,
            redis_error = st.redis_error,
            -- token endpoint: who was refused (a client id is no secret)
            subject = st.auth and st.auth.subject,
            client_ip = st.auth and st.auth.ip,
        }) or "{}"):gsub("\\/", "/"))
    end
    local record = st.auth and st.auth.pending and conf.auth.fail_set[status]
        and st.auth.windows or nil
    if #st.leases > 0 or record then
        local ok, err = ngx.timer.at(0, after_response, conf, st.leases, record, req.warn)
        if not ok then
            req.warn("rl: cannot schedule the after-response work: " .. tostring(err))
        end
    end
end

return _M
