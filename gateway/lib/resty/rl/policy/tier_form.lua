-- resty.rl.policy.tier_form: the tier form (tiers, routes with leases, the
-- token endpoint's auth rules) as a rule policy. resty.rl.policy.config
-- validates a tier-form configuration, then translate() adds the rules
-- that decide it on resty.rl.decide.engine, with the tier form's Redis key names
-- (rlctl reads them), policy names, decisions and refusal details:
--   "{tier}-key"      RL.TAKE of the API key's bucket, ALSO its tenant's
--                     ("{tier}-tenant"), with the tier's strikes and boxes,
--                     on every route but the token endpoint; with the
--                     tier form's `settle`, settled after the response;
--                     with its `allowance`, the tenant's bucket is a rule
--                     of its own, spent from the node's allowance;
--   <lease name>      a route's leases (per tenant, or per argument), a
--                     refusal being work done (the other rules keep their
--                     charge), not listed in RateLimit-Policy;
--   "auth-subject", "auth-ip"  the token endpoint's failure windows
--                     (count = failures), one attempt in flight per subject.
-- Its sample (SAMPLE: the ledger design's tiers, routes and auth rules)
-- fills what a tier-form configuration leaves out.

local problem = require "resty.rl.format.problem"
local mapped = require("resty.rl.base.tables").mapped

local _M = {}

local DAY = 86400

-- A tier of the sample: `key` and `tenant` points a minute (rate and
-- burst), strikes in 60 s, boxes of 300 s, 1 h and `level3` s (0: manual),
-- lease maxima.
local function sample_tier(key, tenant, strikes, level3, concurrency)
    return { key = { rate = key, burst = key }, tenant = { rate = tenant, burst = tenant },
             period = 60, strikes = { threshold = strikes, window = 60 },
             box = { 300, 3600, level3 }, offenses_ttl = DAY, concurrency = concurrency }
end

--- The tier form's sample policy: what a configuration without `rules`
--- takes for the options it does not give (tiers and routes replace the
--- sample's whole tables when given; identity and auth merge).
_M.SAMPLE = {
    -- Who is calling: the API key header and a key -> identity table.
    -- `key_id` names the key in Redis keys and logs (never the key itself).
    identity = {
        header = "X-Api-Key",
        keys = {},
    },
    tiers = {
        sandbox = sample_tier(300, 600, 20, DAY, { reconcile = 1, export = 1 }),
        growth = sample_tier(3000, 6000, 20, DAY, { reconcile = 2, export = 1 }),
        -- level 3 is never automatic: a manual box, released by review
        enterprise = sample_tier(12000, 60000, 100, 0, { reconcile = 8, export = 3 }),
    },
    -- Routes: matched in order by method and template ({name} matches one
    -- path segment). The template, never the raw URL, names the route in
    -- keys, headers, logs and metrics.
    routes = {
        {
            method = "POST", template = "/v1/ledgers/reconcile", cost = 10, critical = true,
            leases = {
                -- one reconcile per ledger; a second one gets 409 Conflict
                { name = "reconcile-ledger", scope = "arg", arg = "ledger_id", max = 1,
                  status = 409, ttl = 300, expected = 5 },
                -- per tenant: tier.concurrency.reconcile
                { name = "reconcile", scope = "tenant", status = 429, ttl = 300, expected = 5 },
            },
        },
        {
            method = "GET", template = "/v1/reports/audit-export", cost = 25, critical = true,
            -- a range (arguments from/to, YYYY-MM-DD) beyond 90 days costs 50
            range = { from_arg = "from", to_arg = "to", max_days = 90, cost = 50 },
            leases = {
                { name = "export", scope = "tenant", status = 429, ttl = 600, expected = 30 },
            },
        },
        { method = "POST", template = "/v1/auth/token", auth = true, critical = true },
        { method = "GET", template = "/v1/ledgers", cost = 1 },
        { method = "GET", template = "/v1/ledgers/{id}", cost = 1 },
        { method = "GET", template = "/v1/ledgers/{id}/entries", cost = 1 },
        { method = "POST", template = "/v1/ledgers/{id}/entries", cost = 1 },
    },
    -- The token endpoint: only failed attempts count (upstream status in
    -- fail_statuses), per subject and per client IP, in a sliding window;
    -- the failure that does not fit locks the subject or IP out.
    auth = {
        subject_arg = "client_id",
        fail_statuses = { 401, 403 },
        subject = { limit = 5, window = 900 },
        ip = { limit = 20, window = 900 },
        box = { 900, 3600, DAY },
        -- one attempt in flight per subject: the lease's ttl (it is given
        -- back after the response; the ttl bounds a release that never
        -- comes), how long an attempt waits for the previous one's lease,
        -- and the Retry-After of an attempt that waited in vain
        attempt_ttl = 30,
        attempt_wait_ms = 500,
        busy_retry_after = 1,
    },
}

-- " Locked for N s." or, for a manual box, " Locked until a manual review."
local function locked(secs)
    return secs and string.format(" Locked for %d s.", secs) or " Locked until a manual review."
end

-- The refusals of the tier's rate rule: the wording of the tier form.
local function describe_rate(e, o, secs)
    if o.state == "boxed" then
        return { strikes = 0, detail = string.format(
            "Tier %s: this API key is in the penalty box (level %d) after repeated throttling.",
            e.tier, o.level or 0) .. locked(secs) }
    end
    -- the binding bucket: the key's (1) or its tenant's (2: in ALSO, or
    -- a rule of its own with `allowance`)
    local b = e.degraded_bucket or (o.binding and o.binding.name ~= e.name and 2 or 1)
    local p = b == 1 and e.params or e.params.also[1]
    local scope = (b == 1 and e.rule.scope[1] == "key_id") and "per-key" or "per-tenant"
    if e.degraded_bucket then
        scope = scope .. " (degraded, local)"
    end
    return { detail = problem.rate_detail(e.tier, { scope = scope, rate = p.rate,
        burst = p.burst, period = p.period }, e.cost, secs or 0) }
end

-- The refusals of the token endpoint's rules.
local function describe_auth(e, o, secs)
    if e.params.kind == "lease" then
        -- another attempt of the subject in flight (one_in_flight)
        return { tier = "auth", detail = "Another attempt for this client is in progress; "
            .. "retry in " .. (secs or 1) .. " s." }
    elseif o.state == "boxed" then
        return { tier = "auth", strikes = 0, detail = "Too many failed attempts." .. locked(secs) }
    end
    return { tier = "auth", detail = "Too many failed attempts; retry in " .. (secs or 0) .. " s." }
end

-- A lease of a route: its rule.
local function lease_rule(route, spec, name)
    local per = spec.scope == "arg" and ("per " .. spec.arg) or "per tenant"
    local key = "{t:<tenant>}:lease:" .. spec.name
        -- no argument: one shared lock for the requests that name none
        .. (spec.scope == "arg" and (":<arg:" .. spec.arg .. "|->") or "")
    return {
        name = name, scope = { "tenant" }, key = key, match = { routes = { route.name } },
        limiter = { kind = "lease", max = spec.max or ("tier.concurrency." .. spec.name),
                    ttl = spec.ttl, expected = spec.expected },
        -- a conflict is work done: the rate rule keeps its charge
        policy_header = false,
        on_refusal = { status = spec.status, keep_charges = true, describe = function(e, _, secs)
            return { detail = string.format("Tier %s: at most %d concurrent %s request(s) %s; "
                .. "retry in %d s.", e.tier, e.params.max, spec.name, per, secs or 1) }
        end },
    }
end

-- A failure window of the token endpoint (`w`: auth.subject or auth.ip).
local function auth_rule(name, attr, key, routes, auth, w)
    return {
        name = name, scope = { attr }, key = key, match = { routes = routes },
        count = "failures", fail_statuses = auth.fail_statuses,
        -- every attempt asks Redis (an operator's DEL frees the subject at once)
        deny_cache = false,
        -- the failure that does not fit trips the box (every refusal a strike)
        limiter = { kind = "window", limit = w.limit, window = w.window,
                    strikes = { threshold = 1, window = w.window, every_refusal = true },
                    box = auth.box },
        on_refusal = { decisions = { boxed = "locked_out" }, describe = describe_auth },
    }
end

--- A copy of `t` without its ngx.null fields (Kong stores an unset field
--- as null), nested tables likewise; a table left empty is nil too,
--- unless `keep_empty`.
function _M.without_nulls(t, keep_empty)
    if type(t) ~= "table" then
        if t == ngx.null then
            return nil
        end
        return t
    end
    local out = mapped(t, _M.without_nulls, keep_empty)
    return (keep_empty or next(out) ~= nil) and out or nil
end

--- Adds to `conf` (a validated tier-form configuration) the rule policy
--- that decides it, and the options the engine reads of it.
function _M.translate(conf)
    -- a schema-filled empty record (Kong: null fields) is none
    for opt, field in pairs({ settle = "from", allowance = "size" }) do
        local v = conf[opt]
        if type(v) == "table" and (v[field] == nil or v[field] == ngx.null) then
            conf[opt] = nil
        end
    end
    -- an allowance's unset options (and an unset home) take their defaults
    conf.allowance = _M.without_nulls(conf.allowance)
    local rate_routes, auth_routes, leases = {}, {}, {}
    local names = {}
    for _, r in ipairs(conf.routes) do
        if r.auth then
            -- no API key: the token endpoint's callers have none
            r.public = true
            auth_routes[#auth_routes + 1] = r.name
        else
            rate_routes[#rate_routes + 1] = r.name
            for _, spec in ipairs(r.leases or {}) do
                local name = spec.name
                if names[name] then
                    name = name .. "-" .. (#leases + 1)
                end
                names[name] = true
                leases[#leases + 1] = lease_rule(r, spec, name)
            end
        end
    end
    rate_routes[#rate_routes + 1] = conf.default_route.name
    local tenant = { name = "{tier}-tenant", scope = { "tenant" }, key = "{t:<tenant>}:tenant",
                     rate = "tier.tenant.rate", burst = "tier.tenant.burst", period = "tier.period" }
    local list = { {
        name = "{tier}-key", scope = { "key_id" }, key = "{t:<tenant>}:key:<key_id>",
        match = { routes = rate_routes }, cost = "route", settle = conf.settle,
        limiter = { kind = "bucket", rate = "tier.key.rate", burst = "tier.key.burst",
                    period = "tier.period", strikes = "tier.strikes", box = "tier.box",
                    offenses_ttl = "tier.offenses_ttl",
                    also = not conf.allowance and { tenant } or nil },
        on_refusal = { describe = describe_rate },
    } }
    if conf.allowance then
        -- the tenant's bucket a rule of its own, spent from the node's allowance
        list[2] = { name = tenant.name, scope = tenant.scope, key = tenant.key,
                    match = { routes = rate_routes }, cost = "route", allowance = conf.allowance,
                    limiter = { kind = "bucket", rate = tenant.rate, burst = tenant.burst,
                                period = tenant.period },
                    on_refusal = { describe = describe_rate } }
    end
    for _, l in ipairs(leases) do
        list[#list + 1] = l
    end
    local a = conf.auth
    if #auth_routes > 0 then
        list[#list + 1] = auth_rule("auth-subject", "subject", "{auth:sub:<subject>}",
            auth_routes, a, a.subject)
        list[#list].one_in_flight = { ttl = a.attempt_ttl, wait_ms = a.attempt_wait_ms,
                                      retry_after = a.busy_retry_after }
        list[#list + 1] = auth_rule("auth-ip", "ip", "{auth:ip:<ip|->}", auth_routes, a, a.ip)
    end
    conf.rules = list
    conf.subject_arg = a.subject_arg
    local header = conf.identity.header
    conf.identity = {
        api_key = { header = header, keys = conf.identity.keys },
        required = true,
        unauthenticated_detail = "Send a valid API key in the " .. header .. " header.",
    }
    if conf.client_ip_header then
        -- the tier form trusts the header as it comes
        conf.trusted_proxies = { "*" }
    end
    -- a route failing closed keeps its static policies (RateLimit-Policy)
    conf.fail_closed_policy = true
    -- RateLimit binds the policy with the fewest units left
    conf.binding_by_remaining = true
    return conf
end

return _M
