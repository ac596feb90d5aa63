-- resty.rl.config: the request policy as data, its defaults and validation.
--
-- A gateway is configured with one Lua table (the nginx front end passes it
-- to resty.rl.gateway.new, the Kong plugin gets it from its schema). Every
-- option has a default here, so a configuration only states what differs.
-- gateway/REFERENCE.md documents each option.

local _M = {}

local DAY = 86400

--- The default policy: the three tiers, the route table and the auth rules
--- of the sample (sandbox, growth, enterprise).
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
    -- The edge deny cache (resty.rl.deny): boxed keys answered by the node
    -- until the box ends; a cached box is asked of Redis again once it is
    -- `recheck` seconds old (a release by any client is seen within that
    -- and one round trip), and dropped within `poll` seconds of
    -- INCR <key_prefix>:deny:version.
    deny_cache = { dict = "rl_deny", poll = 1, manual_ttl = 60, recheck = 2 },
    -- The usage dashboard of rule policies (resty.rl.usage): per-key
    -- counters of this node in the lua_shared_dict `dict` (not declared:
    -- no counters); at most reports_per_second usage reports per key and
    -- node; `usage = false` turns the endpoints and counters off.
    usage = { dict = "rl_usage", reports_per_second = 10 },
    -- Who is calling: the API key header and a key -> identity table.
    -- `key_id` names the key in Redis keys and logs (never the key itself).
    identity = {
        header = "X-Api-Key",
        keys = {},
    },
    -- Header with the client address when behind a trusted proxy
    -- (nil: the connection's address).
    client_ip_header = nil,
    tiers = {
        sandbox = {
            key = { rate = 300, burst = 300 },
            tenant = { rate = 600, burst = 600 },
            period = 60,
            strikes = { threshold = 20, window = 60 },
            box = { 300, 3600, DAY },
            offenses_ttl = DAY,
            concurrency = { reconcile = 1, export = 1 },
        },
        growth = {
            key = { rate = 3000, burst = 3000 },
            tenant = { rate = 6000, burst = 6000 },
            period = 60,
            strikes = { threshold = 20, window = 60 },
            box = { 300, 3600, DAY },
            offenses_ttl = DAY,
            concurrency = { reconcile = 2, export = 1 },
        },
        enterprise = {
            key = { rate = 12000, burst = 12000 },
            tenant = { rate = 60000, burst = 60000 },
            period = 60,
            strikes = { threshold = 100, window = 60 },
            -- level 3 is never automatic: a manual box, released by review
            box = { 300, 3600, 0 },
            offenses_ttl = DAY,
            concurrency = { reconcile = 8, export = 3 },
        },
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
    -- A request that matches no route: its name and cost.
    default_route = { template = "other", cost = 1, critical = false },
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

-- Escapes Lua pattern magic characters.
local function literal(s)
    return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"))
end

--- Compiles a route template ("/v1/ledgers/{id}/entries") to an anchored
--- Lua pattern; each {name} matches one non-empty path segment.
function _M.template_pattern(template)
    local parts = {}
    local pos = 1
    while true do
        local s, e = template:find("{[%w_]+}", pos)
        if not s then
            parts[#parts + 1] = literal(template:sub(pos))
            break
        end
        parts[#parts + 1] = literal(template:sub(pos, s - 1))
        parts[#parts + 1] = "[^/]+"
        pos = e + 1
    end
    return "^" .. table.concat(parts) .. "/?$"
end

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
    r.pattern = _M.template_pattern(r.template)
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
--- the defaults, the user's tiers and routes only (the sample tiers and
--- routes are those of the tier form), then resty.rl.rules.
function _M.build_rules(conf, user)
    validate_general(conf)
    conf.tiers = deep_copy(user.tiers or {})
    conf.routes = deep_copy(user.routes or {})
    conf.identity = deep_copy(user.identity or {})
    conf.auth = nil
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
    return route_budgets(require("resty.rl.rules").compile(conf))
end

--- Builds a complete, validated configuration from `user` (a partial
--- table, possibly nil) over the defaults. Raises an error naming the
--- offending option. Tiers, routes and identity keys given by the user
--- replace the defaults' whole tables when given.
function _M.build(user)
    user = user or {}
    local conf = merge(_M.defaults, user)
    -- lists and tables of entries replace rather than merge
    if user.tiers ~= nil and user.tiers ~= ngx.null then
        conf.tiers = deep_copy(user.tiers)
    end
    if user.routes ~= nil and user.routes ~= ngx.null then
        conf.routes = deep_copy(user.routes)
    end
    check(type(conf.redis.host) == "string", "redis.host must be a string")
    if user.rules ~= nil then
        return _M.build_rules(conf, user)
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
    return route_budgets(conf)
end

return _M
