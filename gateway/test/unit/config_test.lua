-- resty.rl.policy.config: the general options and the tier form over the
-- defaults: good configurations build, and each bad option stops the
-- build with an error naming it.
local T = require "unit"
local config = require "resty.rl.policy.config"
local gateway = require "resty.rl.gateway"

local GW = T.gateway_dir

-- A fresh, valid tier-form configuration: one tier, two routes (one with
-- a lease per tenant), the auth rules of the defaults.
local function tier_form()
    return {
        tiers = { t = { key = { rate = 10, burst = 20 }, tenant = { rate = 30, burst = 40 },
                        period = 60, strikes = { threshold = 5, window = 60 },
                        box = { 300, 3600, 0 }, offenses_ttl = 86400,
                        concurrency = { busy = 2 } } },
        routes = {
            { method = "POST", template = "/v1/x", cost = 10,
              leases = { { name = "busy", scope = "tenant" } } },
            { method = "GET", template = "/v1/items/{id}", cost = 1 },
        },
        identity = { keys = { ["k-1"] = { tenant = "acme", tier = "t", key_id = "k1" } } },
    }
end

-- A case of the tables of bad options: tier_form() (which builds) changed
-- by `c.mod` is refused with an error containing `c.err`.
local refused = T.refusing(tier_form, config.build, "rl config: ")

T.test("the defaults build: the sample tiers, routes and auth rules", function()
    local conf = config.build()
    T.eq(conf.redis.host, "127.0.0.1")
    T.eq(conf.redis.port, 6379)
    T.eq(conf.redis.mode, "single")
    T.eq(conf.redis.metrics_dict, "rl_metrics", "the cluster's counters go with the others")
    T.ok(conf.tiers.sandbox and conf.tiers.growth and conf.tiers.enterprise, "the three tiers")
    T.eq(conf.routes[1].name, "POST /v1/ledgers/reconcile")
    T.eq(conf.routes[1].critical, true)
    T.eq(conf.routes[1].leases[1].status, 409)
    T.eq(conf.routes[4].critical, false)
    T.eq(conf.routes[3].range, nil)
    T.eq(conf.routes[2].range, { from_arg = "from", to_arg = "to", max_days = 90, cost = 50 })
    T.eq(conf.default_route.name, "other")
    T.eq(conf.auth.fail_set, { [401] = true, [403] = true })
    T.eq(conf.rules[1].name, "{tier}-key", "the tier form runs as a rule policy")
end)

T.test("the base configuration of the bad-option cases builds", function()
    T.eq(config.build(tier_form()).tiers.t.key, { rate = 10, burst = 20 })
end)

T.test("user options merge into the defaults; lists and tiers replace them", function()
    local conf = config.build({ redis = { port = 7000, timeout_ms = ngx.null }, key_prefix = "x",
                                auth = { subject = { limit = 3 } },
                                fallback_ratio = ngx.null })
    T.eq(conf.redis.port, 7000)
    T.eq(conf.redis.host, "127.0.0.1", "a field not given keeps its default")
    T.eq(conf.redis.timeout_ms, 20, "null keeps the default")
    T.eq(conf.fallback_ratio, 0.25, "null keeps the default")
    T.eq(conf.key_prefix, "x")
    T.eq(conf.auth.subject, { limit = 3, window = 900 })
    local own = config.build(tier_form())
    local names = {}
    for name in pairs(own.tiers) do
        names[#names + 1] = name
    end
    T.eq(names, { "t" }, "the user's tiers replace the sample's")
    T.eq(#own.routes, 2, "the user's routes replace the sample's")
    T.eq(own.routes[2].name, "GET /v1/items/{id}")
    T.eq(own.routes[1].leases[1], { name = "busy", scope = "tenant", status = 429, ttl = 300 })
end)

T.test("a route's own Redis budget", function()
    local u = tier_form()
    u.routes[2].timeout_ms = 5000
    local conf = config.build(u)
    T.eq(conf.routes[1].store_conf, nil, "none without timeout_ms")
    local sc = conf.routes[2].store_conf
    T.eq(sc.redis.timeout_ms, 5000)
    T.eq(sc.redis.port, conf.redis.port, "the rest of redis is the configuration's")
    T.eq(sc.key_prefix, conf.key_prefix, "every other field is the configuration's")
    T.eq(conf.redis.timeout_ms, 20, "the configuration's budget unchanged")
end)

T.test("the shipped sample policy and the tests' policy build", function()
    local sample = gateway.new(dofile(GW .. "/nginx/policy.lua"))
    T.ok(sample.conf.tiers.growth, "the sample's growth tier")
    local test_policy = dofile(GW .. "/test/policy.lua")
    T.ok(gateway.new(test_policy({ redis = { port = 1 } })).conf.tiers.load, "the load tier")
end)

T.cases("route templates", {
    { name = "a segment", template = "/v1/ledgers/{id}/entries",
      yes = { "/v1/ledgers/abc/entries", "/v1/ledgers/abc/entries/", "/v1/ledgers/a.b-c/entries" },
      no = { "/v1/ledgers//entries", "/v1/ledgers/a/b/entries", "/v1/ledgers/abc/entries/x",
             "/x/v1/ledgers/abc/entries" } },
    { name = "magic characters are literal", template = "/v1/a.b+(c)%[d]-e*?",
      yes = { "/v1/a.b+(c)%[d]-e*?" }, no = { "/v1/axb+(c)%[d]-e*?", "/v1/a.bb(c)%[d]-e" } },
    { name = "two segments", template = "/v1/{a}/{b}", yes = { "/v1/x/y" },
      no = { "/v1/x", "/v1/x/y/z" } },
}, function(c)
    local pattern = config.template_pattern(c.template)
    for _, p in ipairs(c.yes) do
        T.ok(p:match(pattern), p .. " matches " .. c.template)
    end
    for _, p in ipairs(c.no) do
        T.ok(not p:match(pattern), p .. " does not match " .. c.template)
    end
end)

-- The general options, shared by both forms: each change to a valid
-- tier-form configuration and the error it gives.
local GENERAL = {
    { name = "redis.host", mod = function(u) u.redis = { host = 5 } end,
      err = "redis.host must be a string" },
    { name = "redis.mode", mod = function(u) u.redis = { mode = "ring" } end,
      err = "redis.mode must be single, cluster or sentinel" },
    { name = "redis.nodes", mod = function(u) u.redis = { mode = "cluster", nodes = { "no-port" } } end,
      err = 'redis.nodes must be a list of "host:port" (cluster seeds)' },
    { name = "redis.nodes empty", mod = function(u) u.redis = { mode = "cluster", nodes = {} } end,
      err = 'redis.nodes must be a list of "host:port"' },
    { name = "redis.database in a cluster",
      mod = function(u) u.redis = { mode = "cluster", database = 2 } end,
      err = "redis.database: a cluster has only database 0" },
    { name = "redis.dict not declared",
      mod = function(u) u.redis = { mode = "cluster", nodes = { "127.0.0.1:7000" }, dict = "nope" } end,
      err = "redis.dict: lua_shared_dict nope (the cluster's slot map) is not declared" },
    { name = "redis.sentinels", mod = function(u) u.redis = { mode = "sentinel" } end,
      err = 'redis.sentinels must be a list of "host:port"' },
    { name = "redis.master_name",
      mod = function(u) u.redis = { mode = "sentinel", sentinels = { "h:1" }, master_name = "" } end,
      err = "redis.master_name must be a string" },
    { name = "redis.refresh_ms", mod = function(u) u.redis = { refresh_ms = 0 } end,
      err = "redis.refresh_ms must be > 0" },
    { name = "redis.port", mod = function(u) u.redis = { port = 0 } end,
      err = "redis.port must be an integer" },
    { name = "redis.timeout_ms", mod = function(u) u.redis = { timeout_ms = 0 } end,
      err = "redis.timeout_ms must be > 0" },
    { name = "fallback_ratio", mod = function(u) u.fallback_ratio = 1.5 end,
      err = "fallback_ratio must be in (0, 1]" },
    { name = "fallback_entries", mod = function(u) u.fallback_entries = 0 end,
      err = "fallback_entries must be an integer >= 1" },
    { name = "fail_closed_retry_after", mod = function(u) u.fail_closed_retry_after = 0.5 end,
      err = "fail_closed_retry_after must be an integer >= 1 (seconds)" },
    { name = "http_date_after", mod = function(u) u.http_date_after = -1 end,
      err = "http_date_after must be >= 0 (seconds)" },
    { name = "deny_cache.dict", mod = function(u) u.deny_cache = { dict = 5 } end,
      err = "deny_cache.dict must be a string" },
    { name = "deny_cache.poll", mod = function(u) u.deny_cache = { poll = 0 } end,
      err = "deny_cache.poll must be seconds > 0" },
    { name = "deny_cache.manual_ttl", mod = function(u) u.deny_cache = { manual_ttl = -1 } end,
      err = "deny_cache.manual_ttl must be seconds > 0" },
    { name = "deny_cache.recheck", mod = function(u) u.deny_cache = { recheck = 0 } end,
      err = "deny_cache.recheck must be seconds > 0" },
    { name = "usage", mod = function(u) u.usage = { reports_per_second = 0 } end,
      err = "usage must be false or { dict = <lua_shared_dict name>, reports_per_second" },
}

T.cases("a bad general option is named", GENERAL, refused)

T.cases("good general options", {
    { name = "a cluster from host and port", mod = function(u) u.redis = { mode = "cluster" } end,
      check = function(conf) T.eq(conf.redis.nodes, { "127.0.0.1:6379" }) end },
    { name = "sentinels", mod = function(u)
        u.redis = { mode = "sentinel", sentinels = { "127.0.0.1:26379", "h:26380" } }
    end, check = function(conf) T.eq(conf.redis.master_name, "mymaster") end },
    { name = "usage off", mod = function(u) u.usage = false end,
      check = function(conf) T.eq(conf.usage, false) end },
}, function(c)
    local u = tier_form()
    c.mod(u)
    c.check(config.build(u))
end)

T.cases("a bad tier-form option is named", {
    { name = "no tier", mod = function(u) u.tiers = {} end, err = "at least one tier is needed" },
    { name = "a tier's name", mod = function(u) u.tiers["a b"] = u.tiers.t end,
      err = 'tier name "a b": letters, digits, - and _ only' },
    { name = "key budget", mod = function(u) u.tiers.t.key = nil end,
      err = "tier t: key budget missing" },
    { name = "key.rate", mod = function(u) u.tiers.t.key.rate = 0 end,
      err = "tier t: key.rate must be an integer >= 1" },
    { name = "tenant.burst", mod = function(u) u.tiers.t.tenant.burst = 40.5 end,
      err = "tier t: tenant.burst must be an integer >= 1" },
    { name = "period", mod = function(u) u.tiers.t.period = 1 / 3 end,
      err = "tier t: period must be seconds > 0 with at most 3 decimals" },
    { name = "strikes.threshold", mod = function(u) u.tiers.t.strikes.threshold = 0 end,
      err = "tier t: strikes.threshold must be an integer >= 1" },
    { name = "strikes.window", mod = function(u) u.tiers.t.strikes.window = 0 end,
      err = "tier t: strikes.window must be > 0" },
    { name = "box length", mod = function(u) u.tiers.t.box = { 300, 3600 } end,
      err = "tier t: box needs 3 durations" },
    { name = "box[2]", mod = function(u) u.tiers.t.box = { 300, -1, 0 } end,
      err = "tier t: box[2] must be >= 0 (0 = manual)" },
    { name = "offenses_ttl", mod = function(u) u.tiers.t.offenses_ttl = 0 end,
      err = "tier t: offenses_ttl must be > 0" },
    { name = "a route's template", mod = function(u) u.routes[2].template = "v1/x" end,
      err = "routes[2]: template must start with /" },
    { name = "a route's method", mod = function(u) u.routes[2].method = 5 end,
      err = "routes[2]: method must be a string" },
    { name = "a route's cost", mod = function(u) u.routes[2].cost = 0 end,
      err = "routes[2] (/v1/items/{id}): cost must be an integer >= 1" },
    { name = "a range", mod = function(u) u.routes[2].range = { cost = 5, max_days = 0 } end,
      err = "routes[2].range: cost and max_days must be integers >= 1" },
    { name = "a route's timeout_ms", mod = function(u) u.routes[2].timeout_ms = -1 end,
      err = "routes[2] (/v1/items/{id}): timeout_ms must be > 0" },
    { name = "a lease's name", mod = function(u) u.routes[1].leases[1].name = nil end,
      err = "routes[1].leases[1]: name missing" },
    { name = "a lease's scope", mod = function(u) u.routes[1].leases[1].scope = "user" end,
      err = "routes[1].leases[1]: scope must be tenant or arg" },
    { name = "a lease's arg", mod = function(u) u.routes[1].leases[1].scope = "arg" end,
      err = "routes[1].leases[1]: scope arg needs arg" },
    { name = "a lease's max from the tier",
      mod = function(u) u.tiers.t.concurrency = {} end,
      err = "tier t: concurrency.busy missing (lease of /v1/x)" },
    { name = "a lease's max", mod = function(u) u.routes[1].leases[1].max = 0 end,
      err = "routes[1].leases[1]: max must be >= 1" },
    { name = "a lease's expected", mod = function(u) u.routes[1].leases[1].expected = 0 end,
      err = "routes[1].leases[1]: expected must be seconds > 0" },
    { name = "a burst below a route's cost", mod = function(u) u.tiers.t.key.burst = 9 end,
      err = "tier t: burst below the cost 10 of POST /v1/x" },
    { name = "a burst below a range's cost",
      mod = function(u) u.routes[2].range = { cost = 50, max_days = 90 } end,
      err = "tier t: burst below the cost 50 of GET /v1/items/{id}" },
    { name = "default_route.cost", mod = function(u) u.default_route = { cost = 0 } end,
      err = "default_route.cost must be >= 1" },
    { name = "default_route.timeout_ms", mod = function(u) u.default_route = { timeout_ms = 0 } end,
      err = "default_route.timeout_ms must be > 0" },
    { name = "an API key's tenant", mod = function(u) u.identity.keys["k-1"].tenant = nil end,
      err = "identity.keys: an entry needs a tenant" },
    { name = "an API key's tier", mod = function(u) u.identity.keys["k-1"].tier = "gold" end,
      err = "identity.keys: unknown tier gold" },
    { name = "an API key's key_id", mod = function(u) u.identity.keys["k-1"].key_id = nil end,
      err = "identity.keys: an entry needs a key_id" },
    { name = "an API key that is not a string",
      mod = function(u) u.identity.keys[5] = { tenant = "a", tier = "t", key_id = "x" } end,
      err = "identity.keys: keys are API key strings" },
    { name = "auth limits", mod = function(u) u.auth = { ip = { limit = 0 } } end,
      err = "auth limits must be >= 1" },
    { name = "auth windows", mod = function(u) u.auth = { subject = { window = 0.0005 } } end,
      err = "auth windows must be seconds > 0 with at most 3 decimals" },
    { name = "auth.attempt_ttl", mod = function(u) u.auth = { attempt_ttl = 0 } end,
      err = "auth.attempt_ttl must be seconds > 0 with at most 3 decimals" },
    { name = "auth.busy_retry_after", mod = function(u) u.auth = { busy_retry_after = 0 } end,
      err = "auth.busy_retry_after must be an integer >= 1" },
    { name = "auth.attempt_wait_ms", mod = function(u) u.auth = { attempt_wait_ms = -1 } end,
      err = "auth.attempt_wait_ms must be >= 0" },
}, refused)

T.test("the tier form runs as rules: settle and allowance too", function()
    local conf = config.build(tier_form())
    local names = {}
    for _, r in ipairs(conf.rules) do
        names[#names + 1] = r.name
    end
    T.eq(names, { "{tier}-key", "busy" }, "no token endpoint among its routes")
    T.eq(conf.rules[1].key, "{t:<tenant>}:key:<key_id>", "the tier form's key names")
    T.eq(conf.rules[1].limiter.also[1].key, "{t:<tenant>}:tenant")
    local u = tier_form()
    u.settle = { from = "header", header = "X-Cost" }
    u.allowance = { size = 10 }
    conf = config.build(u)
    T.eq(conf.rules[1].settle.from, "header", "the key's bucket is settled")
    T.eq(conf.rules[1].limiter.also, nil, "the tenant's bucket is a rule of its own")
    T.eq({ conf.rules[2].name, conf.rules[2].key, conf.rules[2].allowance.size },
        { "{tier}-tenant", "{t:<tenant>}:tenant", 10 })
    u = tier_form()
    u.allowance = { size = 0 }
    local ok, err = pcall(config.build, u)
    T.eq(ok, false)
    T.ok(tostring(err):find("allowance.size must be an integer >= 1", 1, true), err)
end)
