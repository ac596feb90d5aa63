-- resty.rl.policy.config: the request policy as data, its defaults and validation.
--
-- A gateway is configured with one Lua table (the nginx front end passes it
-- to resty.rl.gateway.new, the Kong plugin gets it from its schema). Every
-- general option has a default here, so a configuration only states what
-- differs. A configuration is a rule policy (`rules`, resty.rl.policy.rules) or
-- the tier form (resty.rl.policy.tier_form: its sample fills what it leaves out,
-- and it is translated into a rule policy). gateway/REFERENCE.md
-- documents each option.

local rules = require "resty.rl.policy.rules"
local tier_form = require "resty.rl.policy.tier_form"

local _M = {}

--- The general options of every configuration, with their defaults.
_M.defaults = {
    -- Redis with the rl module. timeout_ms is the budget of one call
    -- (connect, send and read each); a slower reply counts as a failure.
    redis = {
        host = "127.0.0.1",
        port = 6379,
        password = nil,
        database = nil,
        timeout_ms = 20,
        pool_size = 64,
        keepalive_ms = 60000,
        -- single (host, port) | cluster (nodes: seeds "host:port"; the
        -- slot map in the lua_shared_dict `dict`) | sentinel (sentinels:
        -- "host:port" list; the primary named master_name)
        mode = "single",
        nodes = nil,
        sentinels = nil,
        master_name = "mymaster",
        sentinel_password = nil,
        dict = "rl_redis",
        -- cluster: at most one slot map refresh per nginx node this often;
        -- sentinel: the primary's address asked again this often (and at
        -- once after a connection error or a READONLY reply)
        refresh_ms = 1000,
    },
    -- Every Redis key starts with this prefix, then a hash tag per tenant.
    key_prefix = "rl",
    -- Shadow mode: decide and log as usual, but let every request through
    -- and add no rate-limit header.
    shadow = false,
    -- Also send RateLimit-Limit / RateLimit-Remaining / RateLimit-Reset.
    legacy_headers = false,
    -- Base of the problem `type` URIs (".../rate-limit-exceeded", ...).
    problem_base = "https://api.example.com/problems",
    -- Retry-After of a fail-closed 503.
    fail_closed_retry_after = 15,
    -- Local per-worker limiter used when Redis fails on a non-critical
    -- route: this fraction of the tier's budgets.
    fallback_ratio = 0.25,
    -- Entries (API keys and tenants) the local limiter remembers per worker.
    fallback_entries = 10000,
    -- lua_shared_dict holding the Prometheus counters (none: no counters).
    metrics_dict = "rl_metrics",
    -- Boxes of at least this many seconds get an HTTP-date Retry-After.
    http_date_after = 3600,
    -- Status of a manual box (enterprise level 3: no time to come back).
    manual_box_status = 403,
    -- The edge deny cache (resty.rl.limit.deny): boxed keys answered by the node
    -- until the box ends; a cached box is asked of Redis again once it is
    -- `recheck` seconds old (a release by any client is seen within that
    -- and one round trip), and dropped within `poll` seconds of
    -- INCR <key_prefix>:deny:version.
    deny_cache = { dict = "rl_deny", poll = 1, manual_ttl = 60, recheck = 2 },
    -- The usage dashboard of rule policies (resty.rl.report.usage): per-key
    -- counters of this node in the lua_shared_dict `dict` (not declared:
    -- no counters); at most reports_per_second usage reports per key and
    -- node; `usage = false` turns the endpoints and counters off.
    usage = { dict = "rl_usage", reports_per_second = 10 },
    -- Header with the client address when behind a trusted proxy
    -- (nil: the connection's address).
    client_ip_header = nil,
    -- A request that matches no route: its name and cost.
    default_route = { template = "other", cost = 1, critical = false },
}

local function deep_copy(v)
    if type(v) ~= "table" then
        return v
    end
    local out = {}
    for k, x in pairs(v) do
        out[k] = deep_copy(x)
    end
    return out
end

local function is_array(t)
    return type(t) == "table" and (#t > 0 or next(t) == nil)
end

-- Merges `over` into a copy of `base`: tables merge key by key, arrays and
-- scalars replace. ngx.null (a JSON null) and nil keep the default.
local function merge(base, over)
    if over == nil or over == ngx.null then
        return deep_copy(base)
    end
    if type(base) ~= "table" or type(over) ~= "table" or is_array(over) and #over > 0 then
        return deep_copy(over)
    end
    local out = deep_copy(base)
    for k, v in pairs(over) do
        if v ~= ngx.null then
            out[k] = merge(base[k], v)
        end
    end
    return out
end

local function check(cond, fmt, ...)
    if not cond then
        error("rl config: " .. string.format(fmt, ...), 0)
    end
end

local function positive_int(v)
    return type(v) == "number" and v >= 1 and v == math.floor(v)
end

-- A duration the module takes: seconds > 0, at most 100 years, with at
-- most 3 decimals (1/3 is refused).
local function seconds(v)
    if type(v) ~= "number" or v <= 0 or v > 3153600000 then
        return false
    end
    local ms = v * 1000
    return math.abs(ms - math.floor(ms + 0.5)) < 1e-6
end

--- Compiles a route template to an anchored Lua pattern
--- (resty.rl.policy.rules.template_pattern).
_M.template_pattern = rules.template_pattern

local function validate_tier(name, t)
    for _, which in ipairs({ "key", "tenant" }) do
        local b = t[which]
        check(type(b) == "table", "tier %s: %s budget missing", name, which)
        check(positive_int(b.rate), "tier %s: %s.rate must be an integer >= 1", name, which)
        check(positive_int(b.burst), "tier %s: %s.burst must be an integer >= 1", name, which)
    end
    check(seconds(t.period), "tier %s: period must be seconds > 0 with at most 3 decimals", name)
    check(positive_int(t.strikes and t.strikes.threshold),
        "tier %s: strikes.threshold must be an integer >= 1", name)
    check(type(t.strikes.window) == "number" and t.strikes.window > 0,
        "tier %s: strikes.window must be > 0", name)
    check(is_array(t.box) and #t.box == 3, "tier %s: box needs 3 durations", name)
    for i = 1, 3 do
        check(type(t.box[i]) == "number" and t.box[i] >= 0,
            "tier %s: box[%d] must be >= 0 (0 = manual)", name, i)
    end
    check(type(t.offenses_ttl) == "number" and t.offenses_ttl > 0,
        "tier %s: offenses_ttl must be > 0", name)
    t.concurrency = t.concurrency or {}
end

local function validate_route(i, r, tiers)
    check(type(r.template) == "string" and r.template:sub(1, 1) == "/",
        "routes[%d]: template must start with /", i)
    check(r.method == nil or type(r.method) == "string", "routes[%d]: method must be a string", i)
    if not r.auth then
        check(positive_int(r.cost), "routes[%d] (%s): cost must be an integer >= 1", i, r.template)
    end
    -- a range without a cost (a schema-filled empty record) is no range
    if r.range and r.range.cost == nil then
        r.range = nil
    end
    if r.range then
        check(positive_int(r.range.cost) and positive_int(r.range.max_days),
            "routes[%d].range: cost and max_days must be integers >= 1", i)
        r.range.from_arg = r.range.from_arg or "from"
        r.range.to_arg = r.range.to_arg or "to"
    end
    if r.timeout_ms == ngx.null then
        -- a schema's unset field (Kong): the configuration's budget
        r.timeout_ms = nil
    end
    check(r.timeout_ms == nil or type(r.timeout_ms) == "number" and r.timeout_ms > 0,
        "routes[%d] (%s): timeout_ms must be > 0", i, r.template)
    r.name = (r.method or "ANY") .. " " .. r.template
    r.pattern = rules.template_pattern(r.template)
    r.critical = r.critical and true or false
    for j, l in ipairs(r.leases or {}) do
        check(type(l.name) == "string", "routes[%d].leases[%d]: name missing", i, j)
        check(l.scope == "tenant" or l.scope == "arg",
            "routes[%d].leases[%d]: scope must be tenant or arg", i, j)
        check(l.scope ~= "arg" or type(l.arg) == "string",
            "routes[%d].leases[%d]: scope arg needs arg", i, j)
        if l.max == nil then
            for tname, t in pairs(tiers) do
                check(positive_int(t.concurrency[l.name]),
                    "tier %s: concurrency.%s missing (lease of %s)", tname, l.name, r.template)
            end
        else
            check(positive_int(l.max), "routes[%d].leases[%d]: max must be >= 1", i, j)
        end
        l.status = l.status or 429
        l.ttl = l.ttl or 300
        check(l.expected == nil or type(l.expected) == "number" and l.expected > 0,
            "routes[%d].leases[%d]: expected must be seconds > 0", i, j)
    end
end

-- The general options every configuration shares (Redis, fallback, ...).
-- A list of "host:port" strings.
local function addr_list(v)
    if type(v) ~= "table" or #v == 0 then
        return false
    end
    for _, a in ipairs(v) do
        if type(a) ~= "string" or not a:match("^[^:]+:%d+$") then
            return false
        end
    end
    return true
end

local function validate_general(conf)
    local r = conf.redis
    check(r.mode == "single" or r.mode == "cluster" or r.mode == "sentinel",
        "redis.mode must be single, cluster or sentinel")
    if r.mode == "cluster" then
        r.nodes = r.nodes or { r.host .. ":" .. r.port }
        check(addr_list(r.nodes), "redis.nodes must be a list of \"host:port\" (cluster seeds)")
        check(r.database == nil or r.database == 0, "redis.database: a cluster has only database 0")
        r.database = nil
        check(type(r.dict) == "string" and ngx.shared[r.dict] ~= nil,
            "redis.dict: lua_shared_dict %s (the cluster's slot map) is not declared", tostring(r.dict))
    elseif r.mode == "sentinel" then
        check(addr_list(r.sentinels), "redis.sentinels must be a list of \"host:port\"")
        check(type(r.master_name) == "string" and r.master_name ~= "",
            "redis.master_name must be a string")
    end
    check(type(r.refresh_ms) == "number" and r.refresh_ms > 0, "redis.refresh_ms must be > 0")
    -- the cluster's redirection counters go where the other counters go
    r.metrics_dict = conf.metrics_dict
    check(positive_int(conf.redis.port), "redis.port must be an integer")
    check(type(conf.redis.timeout_ms) == "number" and conf.redis.timeout_ms > 0,
        "redis.timeout_ms must be > 0")
    check(type(conf.fallback_ratio) == "number" and conf.fallback_ratio > 0
        and conf.fallback_ratio <= 1, "fallback_ratio must be in (0, 1]")
    check(positive_int(conf.fallback_entries), "fallback_entries must be an integer >= 1")
    check(positive_int(conf.fail_closed_retry_after),
        "fail_closed_retry_after must be an integer >= 1 (seconds)")
    check(type(conf.http_date_after) == "number" and conf.http_date_after >= 0,
        "http_date_after must be >= 0 (seconds)")
    local dc = conf.deny_cache
    check(type(dc) == "table" and type(dc.dict) == "string", "deny_cache.dict must be a string")
    check(type(dc.poll) == "number" and dc.poll > 0, "deny_cache.poll must be seconds > 0")
    check(type(dc.manual_ttl) == "number" and dc.manual_ttl > 0,
        "deny_cache.manual_ttl must be seconds > 0")
    check(type(dc.recheck) == "number" and dc.recheck > 0,
        "deny_cache.recheck must be seconds > 0")
    check(conf.usage == false or type(conf.usage) == "table" and type(conf.usage.dict) == "string"
        and positive_int(conf.usage.reports_per_second),
        "usage must be false or { dict = <lua_shared_dict name>, reports_per_second = <n >= 1> }")
end

-- The Redis budget of a route (`timeout_ms`, over redis.timeout_ms): its
-- `store_conf`, the configuration with that budget in its `redis` table,
-- for the Redis calls of its requests (every other field is the
-- configuration's own, through __index).
local function route_budgets(conf)
    local routes = { conf.default_route }
    for _, r in ipairs(conf.routes) do
        routes[#routes + 1] = r
    end
    check(conf.default_route.timeout_ms == nil or type(conf.default_route.timeout_ms) == "number"
        and conf.default_route.timeout_ms > 0, "default_route.timeout_ms must be > 0")
    for _, r in ipairs(routes) do
        if r.timeout_ms then
            local rconf = {}
            for k, v in pairs(conf.redis) do
                rconf[k] = v
            end
            rconf.timeout_ms = r.timeout_ms
            r.store_conf = setmetatable({ redis = rconf }, { __index = conf })
        end
    end
    return conf
end

--- A rule policy (a configuration with `rules`): the general options over
--- the defaults, then resty.rl.policy.rules.
local function build_rules(conf)
    validate_general(conf)
    conf.tiers = conf.tiers or {}
    conf.routes = conf.routes or {}
    conf.identity = conf.identity or {}
    for name, t in pairs(conf.tiers) do
        check(type(name) == "string" and name:match("^[%w_%-]+$"),
            "tier name %q: letters, digits, - and _ only", tostring(name))
        check(type(t) == "table", "tier %s must be a table", name)
    end
    for i, r in ipairs(conf.routes) do
        r.cost = r.cost or 1
        check(r.leases == nil and not r.auth, "routes[%d]: leases and auth belong to rules in a "
            .. "rule policy", i)
        validate_route(i, r, {})
    end
    conf.default_route.name = conf.default_route.template
    conf.default_route.critical = conf.default_route.critical and true or false
    return route_budgets(rules.compile(conf))
end

--- Builds a complete, validated configuration from `user` (a partial
--- table, possibly nil) over the defaults. Raises an error naming the
--- offending option. A tier-form configuration takes the sample's tiers,
--- routes, identity and auth rules for those it leaves out (tiers and
--- routes replace the sample's whole tables when given) and is
--- translated into a rule policy (resty.rl.policy.tier_form).
function _M.build(user)
    user = user or {}
    local conf = merge(_M.defaults, user)
    check(type(conf.redis.host) == "string", "redis.host must be a string")
    if user.rules ~= nil then
        return build_rules(conf)
    end
    -- the tier form: the sample's tables for those not given
    for _, k in ipairs({ "identity", "auth" }) do
        conf[k] = merge(tier_form.SAMPLE[k], user[k])
    end
    for _, k in ipairs({ "tiers", "routes" }) do
        if conf[k] == nil then
            conf[k] = deep_copy(tier_form.SAMPLE[k])
        end
    end
    validate_general(conf)
    check(next(conf.tiers) ~= nil, "at least one tier is needed")
    for name, t in pairs(conf.tiers) do
        check(name:match("^[%w_%-]+$"), "tier name %q: letters, digits, - and _ only", name)
        validate_tier(name, t)
    end
    for i, r in ipairs(conf.routes) do
        validate_route(i, r, conf.tiers)
    end
    -- every tier must afford every request (RL.TAKE refuses a cost above
    -- a bucket's capacity)
    for _, r in ipairs(conf.routes) do
        local cost = math.max(r.cost or 0, r.range and r.range.cost or 0)
        for name, t in pairs(conf.tiers) do
            check(cost <= t.key.burst and cost <= t.tenant.burst,
                "tier %s: burst below the cost %d of %s", name, cost, r.name)
        end
    end
    conf.default_route.name = conf.default_route.template
    conf.default_route.critical = conf.default_route.critical and true or false
    check(positive_int(conf.default_route.cost), "default_route.cost must be >= 1")
    for k, id in pairs(conf.identity.keys) do
        check(type(k) == "string", "identity.keys: keys are API key strings")
        check(type(id) == "table" and type(id.tenant) == "string",
            "identity.keys: an entry needs a tenant")
        check(conf.tiers[id.tier] ~= nil, "identity.keys: unknown tier %s", tostring(id.tier))
        check(type(id.key_id) == "string", "identity.keys: an entry needs a key_id")
    end
    local a = conf.auth
    check(positive_int(a.subject.limit) and positive_int(a.ip.limit), "auth limits must be >= 1")
    check(seconds(a.subject.window) and seconds(a.ip.window),
        "auth windows must be seconds > 0 with at most 3 decimals")
    check(seconds(a.attempt_ttl), "auth.attempt_ttl must be seconds > 0 with at most 3 decimals")
    check(positive_int(a.busy_retry_after), "auth.busy_retry_after must be an integer >= 1")
    check(type(a.attempt_wait_ms) == "number" and a.attempt_wait_ms >= 0,
        "auth.attempt_wait_ms must be >= 0")
    local fail = {}
    for _, s in ipairs(a.fail_statuses) do
        fail[s] = true
    end
    a.fail_set = fail
    return route_budgets(rules.compile(tier_form.translate(conf)))
end

return _M
