-- The module commands the gateway sends, argument by argument: each
-- limiter kind's command for a rule, key and cost (resty.rl.limit.limiters,
-- resty.rl.limit.distinct, resty.rl.limit.allowance, resty.rl.limit.settle), the refunds of
-- a refused request, and the commands of the tier form's rules
-- (resty.rl.policy.tier_form).
--
-- resty.rl.redis.commands sends through resty.rl.redis.client.run: `recorded` puts a
-- recorder in its place for the duration of one call, which keeps the
-- commands and answers each with a fixed reply (no Redis here; the
-- end-to-end tests send the same commands to the module).
local T = require "unit"
local config = require "resty.rl.policy.config"
local matching = require "resty.rl.decide.matching"
local limiters = require "resty.rl.limit.limiters"
local commands = require "resty.rl.redis.commands"
local redis = require "resty.rl.redis.client"
local connection = require "resty.rl.redis.connection"
local allowance = require "resty.rl.limit.allowance"
local settle = require "resty.rl.limit.settle"

local ALLOWED = { 1, 10, 9, 6000, -1, 0, -1, 0 }

-- The commands `fn()` sends through resty.rl.redis.client.run (each answered
-- with `reply`, ALLOWED by default), and what `fn` returned.
local function recorded(fn, reply)
    local saved, sent = redis.run, {}
    redis.run = function(_rconf, cmds)
        local out = {}
        for i, c in ipairs(cmds) do
            sent[#sent + 1] = c
            out[i] = reply or ALLOWED
        end
        return out
    end
    local ok, a, b = pcall(fn)
    redis.run = saved
    if not ok then
        error(a, 0)
    end
    return sent, a, b
end

-- The arguments of a command (its array part: a built command also
-- carries its RESP request and reply shape).
local function args(cmd)
    return { unpack(cmd) }
end

-- A compiled rule policy: one tier "pro", the rules of `list` (`usage`:
-- the usage option, default on).
local function compile(list, usage)
    return config.build({
        key_prefix = "u",
        tiers = { pro = { rate = 10, burst = 20, monthly = 500 } },
        routes = { { method = "POST", template = "/v1/pay", cost = 5 } },
        rules = list,
        usage = usage,
    })
end

-- Today's per-day counter of a quota key (the usage dashboard's).
local TODAY = os.date("!%Y-%m-%d", ngx.time())
local function day(key)
    return key .. ":day=" .. TODAY
end

-- A request as a front end adapts it: headers and query arguments.
local function request(headers, query)
    headers, query = headers or {}, query or {}
    return {
        method = function() return "POST" end,
        path = function() return "/v1/pay" end,
        header = function(name) return headers[name] end,
        query_arg = function(name) return query[name] end,
        body_arg = function() return nil end,
        client_ip = function() return "10.1.2.3" end,
    }
end

-- The entry of the first rule of `conf` for the caller key k1 of tenant
-- acme on tier pro (nil when the rule does not apply).
local function entry(conf, req, attrs)
    local ident = { attrs = attrs or { key_id = "k1", tenant = "acme", tier = "pro" },
                    tier_data = conf.tiers.pro, overrides = {}, claims = false }
    return matching.entry(conf, req or request(), { route = conf.routes[1] }, conf.rules[1], ident)
end

-- The command of a rule's entry (`cost`, `record`, `refund`).
local function command_of(rule, cost, record, refund, req)
    local e = entry(compile({ rule }), req)
    return limiters.KINDS[e.params.kind].command(e, cost, record, "req-1", refund)
end

local STRIKES = { threshold = 3, window = 60 }

T.cases("the command of a rule for a key and cost", {
    { name = "a bucket", rule = { name = "b", limiter = { kind = "bucket", rate = 10, burst = 20 } },
      cost = 1, want = { "RL.TAKE", "u:{key_id:k1}:b", 20, 10, 60, "COST", 1 } },
    { name = "a bucket with strikes, a box, offenses and jitter",
      rule = { name = "b", limiter = { kind = "bucket", rate = 10, burst = 20, period = 1,
               strikes = STRIKES, box = { 60, 600, 0 }, offenses_ttl = 3600, jitter = 20 } },
      cost = 3, want = { "RL.TAKE", "u:{key_id:k1}:b", 20, 10, 1, "COST", 3, "STRIKES", 3, 60,
                         "BOX", 60, 600, 0, "OFFENSES", 3600, "JITTER", 20 } },
    { name = "a bucket refund carries no penalty",
      rule = { name = "b", limiter = { kind = "bucket", rate = 10, burst = 20, strikes = STRIKES,
                                       box = { 60, 600, 0 }, delay = 2 } },
      cost = 4, refund = true, want = { "RL.TAKE", "u:{key_id:k1}:b", 20, 10, 60, "REFUND", 4 } },
    { name = "a bucket with its tenant's (ALSO), reserves and a delay",
      rule = { name = "k", limiter = { kind = "bucket", rate = 10, burst = 20, reserve = 50,
               delay = 2, also = { { name = "t", scope = { "tenant" }, rate = 100, burst = 200,
                                     period = 3600, reserve = 20 } } } },
      cost = 1, want = { "RL.TAKE", "u:{key_id:k1}:k", 20, 10, 60, "COST", 1,
                         "ALSO", "u:{key_id:k1}:t:tenant=acme", 200, 100, 3600,
                         "RESERVE", 0, 50, "RESERVE", 1, 20, "DELAY", 2 } },
    { name = "a reserve of 0 is not sent",
      rule = { name = "k", limiter = { kind = "bucket", rate = 10, burst = 20, reserve = 0 } },
      cost = 1, want = { "RL.TAKE", "u:{key_id:k1}:k", 20, 10, 60, "COST", 1 } },
    { name = "a jitter of 0 is not sent",
      rule = { name = "k", limiter = { kind = "bucket", rate = 10, burst = 20, jitter = 0 } },
      cost = 1, want = { "RL.TAKE", "u:{key_id:k1}:k", 20, 10, 60, "COST", 1 } },
    { name = "a sliding window",
      rule = { name = "w", scope = { "tenant" }, limiter = { kind = "window", limit = 5,
                                                            window = 30 } },
      cost = 2, want = { "RL.WINDOW", "u:{tenant:acme}:w", 5, 30, "COST", 2 } },
    { name = "an exact window with strikes",
      rule = { name = "w", limiter = { kind = "window", mode = "exact", limit = 5, window = 30,
                                       strikes = STRIKES } },
      cost = 1, want = { "RL.WINDOW", "u:{key_id:k1}:w", 5, 30, "COST", 1, "EXACT",
                         "STRIKES", 3, 60 } },
    { name = "a window whose every refusal is a strike",
      rule = { name = "w", limiter = { kind = "window", limit = 5, window = 60,
               strikes = { threshold = 1, window = 300, every_refusal = true },
               box = { 300, 3600, 86400 } } },
      cost = 1, want = { "RL.WINDOW", "u:{key_id:k1}:w", 5, 60, "COST", 1,
                         "STRIKES", 1, 300, "EVERY", "BOX", 300, 3600, 86400 } },
    { name = "a fixed window refund keeps its mode",
      rule = { name = "w", limiter = { kind = "window", mode = "fixed", limit = 5, window = 30,
                                       strikes = STRIKES } },
      cost = 1, refund = true,
      want = { "RL.WINDOW", "u:{key_id:k1}:w", 5, 30, "REFUND", 1, "FIXED" } },
    { name = "a window with its tenant's (ALSO)",
      rule = { name = "w", limiter = { kind = "window", limit = 5, window = 30,
               also = { { name = "t", scope = { "tenant" }, limit = 50, window = 60 } } } },
      cost = 1, want = { "RL.WINDOW", "u:{key_id:k1}:w", 5, 30, "COST", 1,
                         "ALSO", "u:{key_id:k1}:t:tenant=acme", 50, 60 } },
    { name = "failures: the probe sends no penalty",
      rule = { name = "f", count = "failures", limiter = { kind = "window", limit = 5,
               window = 900, strikes = STRIKES, box = { 900, 3600, 86400 } } },
      cost = 0, want = { "RL.WINDOW", "u:{key_id:k1}:f", 5, 900, "COST", 0 } },
    { name = "failures: the failure recorded after the response strikes",
      rule = { name = "f", count = "failures", limiter = { kind = "window", limit = 5,
               window = 900, strikes = STRIKES, box = { 900, 3600, 86400 } } },
      cost = 1, record = true,
      want = { "RL.WINDOW", "u:{key_id:k1}:f", 5, 900, "COST", 1, "STRIKES", 3, 60,
               "BOX", 900, 3600, 86400 } },
    { name = "a quota from the tier",
      rule = { name = "q", scope = { "tenant" }, limiter = { kind = "quota",
               limit = "tier.monthly", period = "MONTH" } },
      cost = 1, want = { "RL.QUOTA", "u:{tenant:acme}:q", 500, "MONTH", "COST", 1,
                         "ALSO", day("u:{tenant:acme}:q"), "1000000000000000", "MONTH" } },
    { name = "a quota without the usage dashboard has no per-day counter",
      rule = { name = "q", scope = { "tenant" }, limiter = { kind = "quota", limit = 7,
               period = "WEEK" } }, usage = false,
      cost = 1, want = { "RL.QUOTA", "u:{tenant:acme}:q", 7, "WEEK", "COST", 1 } },
    { name = "a weekly quota's refund gives the day's points back too",
      rule = { name = "q", limiter = { kind = "quota", limit = 9, period = "WEEK" } },
      cost = 5, refund = true, want = { "RL.QUOTA", "u:{key_id:k1}:q", 9, "WEEK", "REFUND", 5,
                                        "ALSO", day("u:{key_id:k1}:q"), "1000000000000000",
                                        "WEEK" } },
    { name = "a daily quota's refund (a day quota is its own day counter)",
      rule = { name = "q", limiter = { kind = "quota", limit = 9, period = "DAY" } },
      cost = 5, refund = true, want = { "RL.QUOTA", "u:{key_id:k1}:q", 9, "DAY", "REFUND", 5 } },
    { name = "a lease names the request",
      rule = { name = "l", scope = { "tenant" }, limiter = { kind = "lease", max = 2,
                                                            ttl = 300 } },
      cost = 1, want = { "RL.LEASE", "ACQUIRE", "u:{tenant:acme}:l", 2, 300, "ID", "req-1" } },
    { name = "a distinct member with its trip",
      rule = { name = "d", scope = { "ip" }, limiter = { kind = "distinct", member = "subject",
               limit = 50, window = 600, trip = { level = 3, duration = 86400 } } },
      req = request(nil, nil), attrs = { subject = "alice" },
      cost = 1, want = { "RL.DISTINCT", "u:{ip:10.1.2.3}:d", "alice", 50, 600,
                         "TRIP", 3, 86400 } },
    { name = "a distinct probe peeks",
      rule = { name = "d", scope = { "ip" }, count = "failures", limiter = { kind = "distinct",
               member = "header:X-User", limit = 50, window = 600,
               trip = { level = 3, duration = 86400 } } },
      req = request({ ["X-User"] = "bob" }), cost = 1,
      want = { "RL.DISTINCT", "u:{ip:10.1.2.3}:d", "bob", 50, 600, "PEEK" } },
}, function(c)
    local conf = compile({ c.rule }, c.usage)
    local e = entry(conf, c.req, c.attrs and setmetatable(c.attrs,
        { __index = { key_id = "k1", tenant = "acme", tier = "pro" } }))
    T.ok(e, "the rule applies")
    T.eq(limiters.KINDS[e.params.kind].command(e, c.cost, c.record, "req-1", c.refund), c.want)
end)

T.test("a distinct rule has no refund", function()
    T.eq(command_of({ name = "d", scope = { "ip" }, limiter = { kind = "distinct",
        member = "ip", limit = 5, window = 60 } }, 1, false, true), nil)
end)

T.cases("Redis keys of rules", {
    { name = "the tag alone", rule = { name = "r", scope = { "tenant" } },
      want = "u:{tenant:acme}:r" },
    { name = "{tier} in the name is not the tier", rule = { name = "{tier}-key" },
      want = "u:{key_id:k1}:tier-key" },
    { name = "more attributes after the tag", rule = { name = "r", scope = { "tenant", "route",
                                                                             "key_id" } },
      want = "u:{tenant:acme}:r:route=" .. ngx.md5("POST /v1/pay") .. ":key_id=k1" },
    { name = "a header value that is not plain is hashed",
      rule = { name = "r", scope = { "header:X-Client" } },
      req = request({ ["X-Client"] = "a b/c" }), want = "u:{header:X-Client:" .. ngx.md5("a b/c")
          .. "}:r" },
    { name = "an argument", rule = { name = "r", scope = { "arg:q" } },
      req = request(nil, { q = "shoes" }), want = "u:{arg:q:shoes}:r" },
    { name = "the client's address", rule = { name = "r", scope = { "ip" } },
      want = "u:{ip:10.1.2.3}:r" },
}, function(c)
    c.rule.limiter = { kind = "window", limit = 5, window = 60 }
    local e = entry(compile({ c.rule }), c.req)
    T.eq(e.key, c.want)
end)

T.test("a rule whose scope the request lacks does not apply", function()
    local conf = compile({ { name = "r", scope = { "header:X-Client" },
                             limiter = { kind = "window", limit = 5, window = 60 } } })
    T.eq(entry(conf, request()), nil)
end)

T.cases("a cost read from an argument", {
    { name = "an integer", units = "3", want = 3 },
    { name = "a fraction: rounded up", units = "2.5", want = 3 },
    { name = "-0: zero, not \"-0\"", units = "-0", want = 0, text = "0" },
    { name = "negative: refused", units = "-1", err = "invalid" },
}, function(c)
    local conf = compile({ { name = "r", cost = { arg = "units" },
                             limiter = { kind = "window", limit = 100, window = 60 } } })
    local e, err = entry(conf, request({}, { units = c.units }))
    if c.err then
        T.eq(err, c.err)
        return
    end
    T.eq(e.cost, c.want)
    if c.text then
        T.eq(tostring(e.cost), c.text)
    end
end)

T.cases("a body the gateway cannot read", {
    { name = "the argument in the query string: read there", query = { units = "2" }, want = 2 },
    { name = "nowhere else: refused", query = {}, err = "unsupported" },
}, function(c)
    local conf = compile({ { name = "r", cost = { arg = "units" },
                             limiter = { kind = "window", limit = 100, window = 60 } } })
    local req = request({}, c.query)
    req.body_arg = function() return nil, "unsupported" end
    local e, err = entry(conf, req)
    if c.err then
        T.eq(err, c.err)
    else
        T.eq(e.cost, c.want)
    end
end)

T.test("the names of a rule and its ALSO buckets take the caller's tier", function()
    local e = entry(compile({ { name = "{tier}-key", limiter = { kind = "bucket", rate = 1,
        burst = 9, also = { { name = "{tier}-tenant", scope = { "tenant" }, rate = 2,
                              burst = 9 } } } } }))
    T.eq(e.name, "pro-key")
    T.eq(e.also_names, { "pro-tenant" })
    T.eq(limiters.KINDS.bucket.policies(e), {
        { name = "pro-key", quota = 1, window = 60, unit = "requests" },
        { name = "pro-tenant", quota = 2, window = 60, unit = "requests" } })
    T.eq(limiters.capacity(e), 9)
end)

T.test("a static command is encoded once and shared by the requests of its key", function()
    local conf = compile({ { name = "s", limiter = { kind = "window", limit = 5, window = 30 } } })
    local e = entry(conf)
    local cmd = limiters.command_of(e, 1)
    T.eq(args(cmd), { "RL.WINDOW", "u:{key_id:k1}:s", "5", "30", "COST", "1" })
    T.eq(cmd.resp, "*6\r\n" .. connection.encode(args(cmd)))
    T.eq(cmd.ints, 8)
    T.ok(limiters.command_of(entry(conf), 1) == cmd, "the same command for the next request")
    T.ok(limiters.command_of(e, 2) ~= cmd, "another for another cost")
end)

T.test("a command with a reference is made per request", function()
    -- (a reference to the tier only is resolved once per tier: a tenant's)
    local conf = compile({ { name = "q", limiter = { kind = "quota",
        limit = { ref = "tenant.monthly", default = 500 }, period = "DAY" } } })
    local cmd = limiters.command_of(entry(conf), 1)
    T.eq(args(cmd), { "RL.QUOTA", "u:{key_id:k1}:q", 500, "DAY", "COST", 1 })
    T.eq(cmd.ints, 8)
    T.eq(cmd.resp, nil, "encoded by the driver")
end)

T.test("an allowance fetch takes its size, at least the cost, partially", function()
    local conf = compile({ { name = "a", allowance = { size = 10 },
                             limiter = { kind = "bucket", rate = 100, burst = 100 } } })
    local e = entry(conf)
    T.eq(allowance.command(e), { "RL.TAKE", "u:{key_id:k1}:a", 100, 100, 60, "COST", 10,
                                 "PARTIAL", "MIN", 1, ints = 9 })
    e.cost = 12
    T.eq(args(allowance.command(e)), { "RL.TAKE", "u:{key_id:k1}:a", 100, 100, 60, "COST", 12,
                                       "PARTIAL", "MIN", 12 })
end)

T.cases("settlement after the response", {
    { name = "a debt", from = "header", actual = 250,
      want = { { "RL.TAKE", "u:{key_id:k1}:s", 1000, 10, 60, "COST", 150, "DEBT" } } },
    { name = "a refund", from = "header", actual = 30,
      want = { { "RL.TAKE", "u:{key_id:k1}:s", 1000, 10, 60, "REFUND", 70 } } },
    { name = "the estimate exact: nothing", from = "header", actual = 100, want = {} },
    { name = "egress bytes, scaled and rounded up", from = "bytes", bytes = 1001, scale = 0.1,
      want = { { "RL.TAKE", "u:{key_id:k1}:s", 1000, 10, 60, "COST", 1, "DEBT" } } },
    { name = "no actual cost: the estimate stands, with a warning", from = "header",
      want = {}, warned = true },
}, function(c)
    local conf = compile({ { name = "s", cost = 100, settle = { from = c.from, header = "X-Cost",
                                                                scale = c.scale },
                             limiter = { kind = "bucket", rate = 10, burst = 1000 } } })
    local e = entry(conf)
    e.actual, e.outcome = c.actual, { state = "allowed" }
    local warned = false
    local cmds = settle.commands({ entries = { e } }, limiters.KINDS, c.bytes,
        function() warned = true end, {})
    T.eq(cmds, c.want)
    T.eq(warned, c.warned or false, "warned")
end)

T.test("a refused request gives back what the admitted rules took", function()
    local conf = compile({
        { name = "k", limiter = { kind = "bucket", rate = 10, burst = 20 } },
        { name = "l", limiter = { kind = "lease", max = 2 } },
        { name = "w", limiter = { kind = "window", limit = 5, window = 60 } },
        { name = "f", count = "failures", limiter = { kind = "window", limit = 5, window = 60 } },
        { name = "t", scope = { "tenant" }, limiter = { kind = "quota", limit = 9,
                                                        period = "DAY" } },
    })
    local ident = { attrs = { key_id = "k1", tenant = "acme", tier = "pro" },
                    tier_data = conf.tiers.pro, overrides = {}, claims = false }
    local sent = {}
    for i, r in ipairs(conf.rules) do
        sent[i] = matching.entry(conf, request(), { route = conf.routes[1] }, r, ident)
        sent[i].cost = 3
    end
    sent[1].outcome, sent[2].outcome = { state = "allowed" }, { state = "allowed" }
    sent[3].outcome, sent[4].outcome = { state = "refused" }, { state = "allowed" }
    sent[5].outcome = { state = "delayed" }
    local state = { request_id = "req-1", leases = { { key = sent[2].key, id = "req-1" },
                                                     { key = "other", id = "req-1" } } }
    local cmds = recorded(function() limiters.compensate(conf, state, sent) end, 1)
    T.eq(cmds, {
        { "RL.TAKE", "u:{key_id:k1}:k", 20, 10, 60, "REFUND", 3 },
        { "RL.LEASE", "RELEASE", "u:{key_id:k1}:l", "req-1" },
        { "RL.QUOTA", "u:{tenant:acme}:t", 9, "DAY", "REFUND", 3 },
    }, "the refused rule keeps its charge, a probe took nothing")
    T.eq(state.leases, { { key = "other", id = "req-1" } }, "the released lease is not held")
    T.eq(state.redis_error, nil)
end)

-- The tier form: the configuration's defaults (the sample tiers).

-- The tier form's rules (resty.rl.policy.tier_form) for key k1 of tenant acme:
-- the entry of rule `name` on `tier`, its API key record shared by the
-- requests of the key.
local SAMPLE = config.build()
local RECORDS = {}
local function tier_entry(name, tier, attrs)
    local rule
    for _, r in ipairs(SAMPLE.rules) do
        if r.name == name then
            rule = r
        end
    end
    RECORDS[tier] = RECORDS[tier] or { tenant = "acme", key_id = "k1", tier = tier }
    local a = attrs or { key_id = "k1", tenant = "acme", tier = tier }
    local ident = { attrs = a, tier_data = SAMPLE.tiers[tier] or {}, overrides = {},
                    claims = false, record = not attrs and RECORDS[tier] or false }
    return matching.entry(SAMPLE, request(), { route = SAMPLE.routes[4] }, rule, ident)
end

T.cases("the tier form's RL.TAKE", {
    { name = "growth, cost 1", tier = "growth", cost = 1,
      want = { "RL.TAKE", "rl:{t:acme}:key:k1", "3000", "3000", "60", "COST", "1",
               "ALSO", "rl:{t:acme}:tenant", "6000", "6000", "60", "STRIKES", "20", "60",
               "BOX", "300", "3600", "86400", "OFFENSES", "86400" } },
    { name = "enterprise: a manual third box", tier = "enterprise", cost = 25,
      want = { "RL.TAKE", "rl:{t:acme}:key:k1", "12000", "12000", "60", "COST", "25",
               "ALSO", "rl:{t:acme}:tenant", "60000", "60000", "60", "STRIKES", "100", "60",
               "BOX", "300", "3600", "0", "OFFENSES", "86400" } },
}, function(c)
    local cmd = limiters.command_of(tier_entry("{tier}-key", c.tier), c.cost)
    T.eq(args(cmd), c.want)
    T.eq(cmd.resp, "*" .. #c.want .. "\r\n" .. connection.encode(c.want))
    T.eq(cmd.ints, 8)
end)

T.test("the tier form's RL.TAKE is made once per key and cost", function()
    local first = limiters.command_of(tier_entry("{tier}-key", "growth"), 1)
    T.ok(limiters.command_of(tier_entry("{tier}-key", "growth"), 1) == first, "the same command")
    T.ok(limiters.command_of(tier_entry("{tier}-key", "growth"), 10) ~= first, "by cost")
end)

T.cases("the token endpoint's failure windows", {
    { name = "a probe writes nothing", record = false,
      want = { { "RL.WINDOW", "rl:{auth:sub:alice}", "5", "900", "COST", "0" },
               { "RL.WINDOW", "rl:{auth:ip:10.0.0.1}", "20", "900", "COST", "0" } } },
    { name = "a failure recorded trips the box at once", record = true,
      want = { { "RL.WINDOW", "rl:{auth:sub:alice}", 5, 900, "COST", 1, "STRIKES", 1, 900,
                 "EVERY", "BOX", 900, 3600, 86400 },
               { "RL.WINDOW", "rl:{auth:ip:10.0.0.1}", 20, 900, "COST", 1, "STRIKES", 1, 900,
                 "EVERY", "BOX", 900, 3600, 86400 } } },
}, function(c)
    local attrs = { subject = "alice", ip = "10.0.0.1" }
    local got = {}
    for i, name in ipairs({ "auth-subject", "auth-ip" }) do
        local e = tier_entry(name, "none", attrs)
        got[i] = args(c.record and limiters.KINDS.window.command(e, 1, true)
            or limiters.command_of(e, 0))
    end
    T.eq(got, c.want)
end)

T.test("leases: acquired with the request id", function()
    local conf = config.build()
    local cmds, d = recorded(function() return commands.acquire(conf, "L", 2, 300, "req-9") end,
        { 1, "req-9", 1, 2, 0 })
    T.eq(cmds, { { "RL.LEASE", "ACQUIRE", "L", 2, 300, "ID", "req-9" } })
    T.eq(d.granted, true)
end)

T.test("encoded: arguments as strings and the RESP request", function()
    local cmd = commands.encoded({ "RL.TAKE", "k", 10, 0.5, "" }, 8)
    T.eq(args(cmd), { "RL.TAKE", "k", "10", "0.5", "" })
    T.eq(cmd.resp, "*5\r\n$7\r\nRL.TAKE\r\n$1\r\nk\r\n$2\r\n10\r\n$3\r\n0.5\r\n$0\r\n\r\n")
    T.eq(cmd.ints, 8)
end)
