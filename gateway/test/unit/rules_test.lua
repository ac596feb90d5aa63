-- resty.rl.policy.rules: rule policies compiled (through resty.rl.policy.config.build,
-- as nginx and Kong configure them): the shipped policies compile, every
-- default a rule gets, references and their resolution per caller.
local T = require "unit"
local config = require "resty.rl.policy.config"
local rules = require "resty.rl.policy.rules"
local refs = require "resty.rl.policy.refs"
local gateway = require "resty.rl.gateway"

local GW = T.gateway_dir

-- A rule policy of `list` (rules) with one tier and one route.
local function policy(list, over)
    local p = {
        key_prefix = "u",
        tiers = { pro = { rate = 10, burst = 20, monthly = 1000, nested = { cap = 3 } } },
        routes = { { method = "POST", template = "/v1/pay", cost = 5 } },
        rules = list,
    }
    for k, v in pairs(over or {}) do
        p[k] = v
    end
    return p
end

-- The compiled first rule of a policy with `rule` alone.
local function compiled(rule, over)
    return config.build(policy({ rule }, over)).rules[1]
end

T.cases("the shipped policies compile", {
    { name = "the ledger design", file = "examples/ledger.lua" },
    { name = "the velocity design", file = "examples/velocity.lua" },
    { name = "the tiered design", file = "examples/tiered.lua" },
}, function(c)
    local gw = gateway.new(dofile(GW .. "/" .. c.file))
    T.ok(#gw.conf.rules >= 3, "its rules")
    for _, r in ipairs(gw.conf.rules) do
        T.ok(r.on_refusal.action and r.unit and r.count, r.name .. " completed")
    end
end)

T.test("the end-to-end tests' rule policies compile", function()
    for _, file in ipairs({ "test/rules.lua", "test/distinct.lua" }) do
        local set = dofile(GW .. "/" .. file)
        local names = {}
        for name in pairs(set) do
            names[#names + 1] = name
        end
        table.sort(names)
        T.ok(#names >= 2, file .. " has policies")
        for _, name in ipairs(names) do
            local ok, err = pcall(gateway.new, set[name])
            T.ok(ok, file .. " " .. name .. ": " .. tostring(err))
        end
    end
end)

T.test("a bucket rule gets its defaults", function()
    local r = compiled({ name = "alpha", limiter = { kind = "bucket", rate = 1, burst = 2 } })
    T.eq(r.scope, { "key_id" })
    T.eq(r.tag, "key_id")
    T.eq(r.attrs, { "key_id" })
    T.eq(r.tag_only, true)
    T.eq(r.limiter, { kind = "bucket", rate = 1, burst = 2, period = 60 })
    T.eq(r.cost, 1)
    T.eq(r.count, "requests")
    T.eq(r.unit, "requests")
    T.eq(r.static_limiter, true)
    T.eq(r.match, {})
    T.eq(r.on_refusal, { action = "reject", status = 429, type = "rate-limit-exceeded" })
end)

T.test("the policy gets its defaults", function()
    local conf = config.build(policy({ { name = "a", limiter = { kind = "bucket", rate = 1,
                                                                  burst = 1 } } },
        { trusted_proxies = { "10.0.0.0/8" } }))
    T.eq(conf.identity.api_key, { header = "X-Api-Key", keys = {} })
    T.eq(conf.identity.store, false)
    T.eq(conf.identity.cache_ttl, 2)
    T.eq(conf.body, { format = "problem" })
    T.eq(conf.alerts, { stream = "u:alerts", maxlen = 10000 })
    T.eq(conf.quota_alerts, { stream = "rl:events:quota", maxlen = 100000 })
    T.eq(conf.upstream_headers, {})
    T.eq(conf.client_ip_header, "X-Forwarded-For", "behind trusted proxies")
    T.eq(conf.auth, nil, "no tier-form auth rules")
    T.eq(conf.routes[1].name, "POST /v1/pay")
    T.eq(conf.default_route.name, "other")
    local tiers = 0
    for _ in pairs(conf.tiers) do
        tiers = tiers + 1
    end
    T.eq(tiers, 1, "only the policy's own tiers")
end)

T.cases("what each kind and option fills in", {
    { name = "a quota answers 403",
      rule = { name = "q", limiter = { kind = "quota", limit = 5, period = "MONTH" } },
      want = { unit = "requests", on_refusal = { action = "quota", status = 403,
                                                  type = "quota-exceeded" } } },
    { name = "a lease counts concurrent requests",
      rule = { name = "l", limiter = { kind = "lease", max = 2 } },
      want = { unit = "concurrent-requests", limiter = { kind = "lease", max = 2, ttl = 300 } } },
    { name = "a distinct limiter counts members",
      rule = { name = "d", scope = { "ip" }, limiter = { kind = "distinct", member = "subject",
                                                         limit = 5, window = 600 } },
      want = { unit = "members", attrs = { "ip", "subject" }, tag_only = false } },
    { name = "a window is sliding", rule = { name = "w", limiter = { kind = "window",
                                                                     limit = 5, window = 60 } },
      want = { limiter = { kind = "window", limit = 5, window = 60, mode = "sliding" } } },
    { name = "a route's cost is in points",
      rule = { name = "r", cost = "route", limiter = { kind = "bucket", rate = 1, burst = 5 } },
      want = { unit = "points" } },
    { name = "an argument's cost is in points",
      rule = { name = "a", cost = { arg = "amount" }, limiter = { kind = "window", limit = 100,
                                                                   window = 60 } },
      want = { unit = "points" } },
    { name = "a unit given stays", rule = { name = "c", unit = "cents", cost = { arg = "amount" },
                                            limiter = { kind = "window", limit = 9, window = 9 } },
      want = { unit = "cents" } },
    { name = "response bytes: cost 1 per byte counted after",
      rule = { name = "b", count = "response_bytes", cost = 50,
               limiter = { kind = "quota", limit = 100, period = "DAY" } },
      want = { cost = 1, unit = "content-bytes", count = "response_bytes" } },
    { name = "failures: 401 and 403 by default",
      rule = { name = "f", count = "failures", limiter = { kind = "window", limit = 5,
                                                           window = 900 } },
      want = { fail_statuses = { 401, 403 }, fail_set = { [401] = true, [403] = true } } },
    { name = "failures listed",
      rule = { name = "f", count = "failures", fail_statuses = { 402 },
               limiter = { kind = "window", limit = 5, window = 900 } },
      want = { fail_set = { [402] = true } } },
    { name = "one attempt in flight", rule = { name = "o", count = "failures",
        one_in_flight = {}, limiter = { kind = "window", limit = 5, window = 900 } },
      want = { one_in_flight = { ttl = 30, wait_ms = 500, retry_after = 1 } } },
    { name = "a soft refusal marks the request",
      rule = { name = "s", on_refusal = { action = "soft" },
               limiter = { kind = "window", limit = 5, window = 60 } },
      want = { on_refusal = { action = "soft", mark_header = "X-RateLimit-Soft-Block",
                              mark_value = "s" } } },
    { name = "a challenge answers 401",
      rule = { name = "c", on_refusal = { action = "challenge" },
               limiter = { kind = "window", limit = 5, window = 60 } },
      want = { on_refusal = { action = "challenge", status = 401, type = "challenge-required" } } },
    { name = "a status of its own", rule = { name = "s", on_refusal = { status = 420 },
                                             limiter = { kind = "window", limit = 5, window = 60 } },
      want = { on_refusal = { action = "reject", status = 420, type = "rate-limit-exceeded" } } },
    { name = "a tag other than the first attribute",
      rule = { name = "t", scope = { "user", "tenant" }, tag = "tenant",
               limiter = { kind = "window", limit = 5, window = 60 } },
      want = { tag = "tenant", attrs = { "user", "tenant" }, tag_only = false } },
    { name = "an also bucket takes its kind and period",
      rule = { name = "k", limiter = { kind = "bucket", rate = 1, burst = 2,
                                       also = { { name = "t", scope = { "tenant" }, rate = 5,
                                                  burst = 9 } } } },
      want = { limiter = { kind = "bucket", rate = 1, burst = 2, period = 60,
                           also = { { name = "t", scope = { "tenant" }, rate = 5, burst = 9,
                                      kind = "bucket", period = 60 } } } } },
    { name = "an allowance", rule = { name = "a", allowance = { size = 10 },
                                      limiter = { kind = "bucket", rate = 100, burst = 100 } },
      want = { allowance = { size = 10, max_age = 1, dict = "rl_allowance", refill_below = 0,
                              borrow = 0 } } },
    { name = "settled from a header",
      rule = { name = "s", settle = { from = "header", header = "X-Cost" },
               limiter = { kind = "bucket", rate = 100, burst = 100 } },
      want = { settle = { from = "header", header = "X-Cost", hide = true, scale = 1,
                          max_body = 1024 * 1024 } } },
    { name = "alerts from level 2, suspending",
      rule = { name = "a", alerts = {}, limiter = { kind = "bucket", rate = 1, burst = 2,
               strikes = { threshold = 3, window = 60 }, box = { 60, 600, 0 } } },
      want = { alerts = { from_level = 2, level3 = "suspend" } } },
    { name = "quota alerts owned by the tenant",
      rule = { name = "q", quota_alerts = { thresholds = { 50, 100 } },
               limiter = { kind = "quota", limit = 10, period = "MONTH" } },
      want = { quota_alerts = { thresholds = { 50, 100 }, owner = "tenant" } } },
}, function(c)
    local r = compiled(c.rule)
    for field, want in pairs(c.want) do
        T.eq(r[field], want, field)
    end
end)

T.cases("references", {
    { name = "a tier field", v = "tier.monthly",
      want = { path = { "tier", "monthly" }, text = "tier.monthly" } },
    { name = "a nested tier field", v = "tier.limits.daily",
      want = { path = { "tier", "limits", "daily" }, text = "tier.limits.daily" } },
    { name = "with a default", v = { ref = "brand.max", default = 5 },
      want = { path = { "brand", "max" }, default = 5, text = "brand.max" } },
    { name = "a tenant field", v = "tenant.cap", want = { path = { "tenant", "cap" },
                                                          text = "tenant.cap" } },
    { name = "another root is a plain string", v = "user.cap", want = nil },
    { name = "no field", v = "tier", want = nil },
    { name = "a number", v = 5, want = nil },
    { name = "a table without ref", v = { default = 5 }, want = nil },
}, function(c)
    T.eq(refs.as_ref(c.v), c.want)
end)

T.test("a limiter with a reference is compiled, and not shared", function()
    local r = compiled({ name = "m", limiter = { kind = "quota", limit = "tier.monthly",
                                                period = "MONTH" } })
    T.eq(r.limiter.limit, { path = { "tier", "monthly" }, text = "tier.monthly" })
    T.eq(r.static_limiter, false)
end)

local TIER = { rate = 10, monthly = 1000, nested = { cap = 3 } }
local REF_RATE, REF_NESTED = refs.as_ref("tier.rate"), refs.as_ref("tier.nested.cap")
local REF_BRAND = refs.as_ref({ ref = "brand.max", default = 5 })
local REF_TENANT = refs.as_ref({ ref = "tenant.plan", default = "basic" })

T.cases("resolve per caller", {
    { name = "not a reference", v = 7, ident = {}, want = 7 },
    { name = "the tier's value", v = REF_RATE, ident = { tier_data = TIER }, want = 10 },
    { name = "a nested tier value", v = REF_NESTED, ident = { tier_data = TIER }, want = 3 },
    { name = "a nested tier value beside a tenant's overrides", v = REF_NESTED,
      ident = { tier_data = TIER, overrides = { tenant = { rate = "25" } } }, want = 3 },
    { name = "a nested tier value below 1 beside a tenant's overrides", v = REF_NESTED,
      ident = { tier_data = { nested = { cap = 0.5 } }, overrides = { tenant = {} } },
      want = 0.5 },
    { name = "a tenant override (a string from Redis)", v = REF_RATE,
      ident = { tier_data = TIER, overrides = { tenant = { rate = "25" } } }, want = 25 },
    { name = "an override below 1 where the tier has >= 1 is ignored", v = REF_RATE,
      ident = { tier_data = TIER, overrides = { tenant = { rate = "0" } } }, want = 10 },
    { name = "an override that is no number is ignored", v = REF_RATE,
      ident = { tier_data = TIER, overrides = { tenant = { rate = "lots" } } }, want = 10 },
    { name = "no tier: the default", v = REF_BRAND, ident = {}, want = 5 },
    { name = "a brand override", v = REF_BRAND,
      ident = { overrides = { brand = { max = "70" } } }, want = 70 },
    { name = "a brand override below 1: the default", v = REF_BRAND,
      ident = { overrides = { brand = { max = "0" } } }, want = 5 },
    { name = "a brand override that is no number: the default", v = REF_BRAND,
      ident = { overrides = { brand = { max = "x" } } }, want = 5 },
    { name = "a string reference", v = REF_TENANT,
      ident = { overrides = { tenant = { plan = "gold" } } }, want = "gold" },
    { name = "a string reference without override", v = REF_TENANT, ident = {},
      want = "basic" },
}, function(c)
    T.eq(refs.resolve(c.v, c.ident), c.want)
end)

T.test("each_value: one value per tier, or the default of a runtime reference", function()
    local tiers = { a = { rate = 1 }, b = { rate = 2 }, c = {} }
    local got = refs.each_value(refs.as_ref({ ref = "tier.rate", default = 9 }), tiers)
    table.sort(got, function(x, y) return x[2] < y[2] end)
    T.eq(got, { { 1, " (tier a)" }, { 2, " (tier b)" }, { 9, " (tier c)" } })
    T.eq(refs.each_value(REF_BRAND, tiers), { { 5, " (default)" } })
    T.eq(refs.each_value(4, tiers), { { 4, "" } })
end)

T.test("upstream headers: references and attributes", function()
    local conf = config.build(policy({ { name = "a", limiter = { kind = "bucket", rate = 1,
                                                                  burst = 1 } } },
        { upstream_headers = { ["X-Tier-Cap"] = "tier.monthly", ["X-User"] = "attr:user" } }))
    T.eq(conf.upstream_headers, { ["X-Tier-Cap"] = { path = { "tier", "monthly" },
                                                     text = "tier.monthly" },
                                  ["X-User"] = "attr:user" })
end)
