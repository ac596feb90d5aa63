-- Redis key names (the tier form's, which rlctl reads: its rules' key
-- templates) and how a key routes in a cluster: resty.rl.redis.cluster's hash
-- slots and slot maps, resty.rl.redis.client's helpers.
local T = require "unit"
local request = require "resty.rl.request.fields"
local config = require "resty.rl.policy.config"
local matching = require "resty.rl.decide.matching"
local cluster = require "resty.rl.redis.cluster"
local connection = require "resty.rl.redis.connection"

T.cases("a value fit for a key", {
    { name = "plain and short: kept", v = "acme-1.eu_west:9@x", want = "acme-1.eu_west:9@x" },
    { name = "a number", v = 42, want = "42" },
    { name = "-0: as 0", v = -0.0, want = "0" },
    { name = "15 digits: every one", v = 123456789012346, want = "123456789012346" },
    { name = "a fraction: as short as it reads back", v = 0.1, want = "0.1" },
    { name = "a fraction of 17 digits", v = 0.1 + 0.2, want = "0.30000000000000004" },
    { name = "a space: hashed", v = "a b", want = ngx.md5("a b") },
    { name = "a brace: hashed", v = "a}b", want = ngx.md5("a}b") },
    { name = "64 bytes: kept", v = string.rep("a", 64), want = string.rep("a", 64) },
    { name = "65 bytes: hashed", v = string.rep("a", 65), want = ngx.md5(string.rep("a", 65)) },
    { name = "empty: hashed", v = "", want = ngx.md5("") },
}, function(c)
    T.eq(request.key_part(c.v), c.want)
end)

-- The key of the tier form's rule `name` (resty.rl.policy.tier_form) for a
-- caller of `tier` with attributes `attrs`; the entry too.
local SAMPLE = config.build()
local function tier_key(name, tier, attrs, query)
    for _, rule in ipairs(SAMPLE.rules) do
        if rule.name == name then
            local req = { query_arg = function(n) return (query or {})[n] end,
                          body_arg = function() return nil end }
            local ident = { attrs = attrs, tier_data = SAMPLE.tiers[tier] or {},
                            overrides = {}, claims = false, record = false }
            local e = matching.entry(SAMPLE, req, { route = SAMPLE.routes[1] }, rule, ident)
            return e.key, e
        end
    end
end

T.test("the tier form's keys: one hash tag per tenant", function()
    local function who()
        return { tenant = "acme", key_id = "g1", tier = "growth" }
    end
    local key, e = tier_key("{tier}-key", "growth", who())
    local tenant = e.also_keys[1]
    T.eq(key, "rl:{t:acme}:key:g1")
    T.eq(tenant, "rl:{t:acme}:tenant")
    T.eq(cluster.keyslot(key), cluster.keyslot(tenant), "one slot")
    T.eq(tier_key("export", "growth", who()), "rl:{t:acme}:lease:export")
    T.eq(tier_key("reconcile-ledger", "growth", who(), { ledger_id = "L1" }),
        "rl:{t:acme}:lease:reconcile-ledger:L1")
    T.eq(tier_key("reconcile-ledger", "growth", who()), "rl:{t:acme}:lease:reconcile-ledger:-",
        "no argument: one shared lock")
    T.eq(tier_key("auth-subject", "none", { subject = "alice" }), "rl:{auth:sub:alice}")
    T.eq(tier_key("auth-ip", "none", { ip = "10.0.0.1" }), "rl:{auth:ip:10.0.0.1}")
    local _, ent = tier_key("export", "enterprise", { tenant = "acme", key_id = "e1",
                                                       tier = "enterprise" })
    T.eq(ent.params.max, 3, "the tier's concurrency")
    local _, fixed = tier_key("reconcile-ledger", "enterprise", { tenant = "acme", key_id = "e1",
                                                                   tier = "enterprise" })
    T.eq(fixed.params.max, 1, "the lease's own max")
end)

T.cases("hash slots as Redis computes them", {
    { name = "CRC16 check value", crc = "123456789", want = 0x31C3 },
    { name = "a plain key", key = "foo", want = 12182 },
    { name = "a hash tag", key = "{user1000}.following", same_as = "user1000" },
    { name = "the first tag only", key = "foo{bar}{zap}", same_as = "bar" },
    { name = "an empty tag: the whole key", key = "foo{}{bar}", want_whole = true },
    { name = "a brace inside the tag", key = "foo{{bar}}zap", same_as = "{bar" },
    { name = "no closing brace: the whole key", key = "foo{bar", want_whole = true },
}, function(c)
    if c.crc then
        T.eq(cluster.crc16(c.crc), c.want)
    elseif c.want then
        T.eq(cluster.keyslot(c.key), c.want)
    elseif c.same_as then
        T.eq(cluster.keyslot(c.key), cluster.crc16(c.same_as) % 16384)
    else
        T.eq(cluster.keyslot(c.key), cluster.crc16(c.key) % 16384)
    end
end)

T.test("the slot map from CLUSTER SHARDS: online primaries only", function()
    local reply = {
        { "slots", { 0, 5460 }, "nodes", {
            { "id", "a", "port", 7000, "ip", "127.0.0.1", "role", "master", "health", "online" },
            { "id", "b", "port", 7003, "ip", "127.0.0.1", "role", "replica", "health", "online" },
        } },
        { "slots", { 5461, 10922, 16000, 16383 }, "nodes", {
            { "id", "c", "port", 7001, "ip", "127.0.0.2", "role", "master", "health", "online" },
        } },
        { "slots", { 10923, 15999 }, "nodes", {
            { "id", "d", "port", 7002, "ip", "127.0.0.3", "role", "master", "health", "fail" },
        } },
    }
    T.eq(cluster.parse_shards(reply), {
        { 0, 5460, "127.0.0.1:7000" }, { 5461, 10922, "127.0.0.2:7001" },
        { 16000, 16383, "127.0.0.2:7001" } })
    T.eq(cluster.parse_shards("ERR"), nil)
    T.eq(cluster.parse_shards({ "junk", { 1 } }), {})
end)

T.test("the slot map from CLUSTER SLOTS: an empty host is the node asked", function()
    local reply = {
        { 0, 5460, { "127.0.0.1", 7000, "a" }, { "127.0.0.1", 7003, "b" } },
        { 5461, 16383, { "", 7001, "c" } },
        { 1, 2 },
    }
    T.eq(cluster.parse_slots(reply, "10.0.0.9"), {
        { 0, 5460, "127.0.0.1:7000" }, { 5461, 16383, "10.0.0.9:7001" } })
    T.eq(cluster.parse_slots(nil, "h"), nil)
end)

T.cases("the key a command routes by", {
    { name = "the first argument", cmd = { "RL.TAKE", "k", 1, 1, 1 }, want = "k" },
    { name = "a lease's key follows its subcommand", cmd = { "RL.LEASE", "ACQUIRE", "k", 1, 1 },
      want = "k" },
    { name = "in lower case too", cmd = { "rl.lease", "RELEASE", "k", "id" }, want = "k" },
}, function(c)
    T.eq(connection.key_of(c.cmd), c.want)
end)

T.test("helpers: a flat map, an address", function()
    T.eq(connection.flat_map({ "a", 1, "b", "x", "odd" }), { a = 1, b = "x" })
    T.eq({ connection.addr("127.0.0.1:6379") }, { "127.0.0.1", 6379 })
    T.eq({ connection.addr("[::1]:7000") }, { "[::1]", 7000 })
    T.eq({ connection.addr("no-port") }, {})
    T.eq(connection.encode({ "GET", 5, "" }), "$3\r\nGET\r\n$1\r\n5\r\n$0\r\n\r\n")
end)

T.cases("the cost of a date range", {
    { name = "within max_days", from = "2026-11-01", to = "2026-11-30", want = 1 },
    { name = "beyond it", from = "2026-01-01", to = "2026-11-30", want = 50 },
    { name = "ending before it starts", from = "2026-12-01", to = "2020-01-01", want = 50 },
    { name = "no start", to = "2026-11-30", want = 50 },
}, function(c)
    local route = { cost = 1, range = { from_arg = "from", to_arg = "to", max_days = 90, cost = 50 } }
    local req = { query_arg = function(n) return ({ from = c.from, to = c.to })[n] end,
                  body_arg = function() return nil end }
    T.eq(request.cost(route, req), c.want)
end)
