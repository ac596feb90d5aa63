-- A quota counted per region (`region = true` on a quota limiter): every
-- command of the rule carries REGION (the charge with its per-day
-- counter, a refund, the command shared by a static key, the usage
-- dashboard's probes), and a rule without it sends none. The end-to-end
-- test with two regions is tests/gateway_regions.rs.
local T = require "unit"
local config = require "resty.rl.policy.config"
local matching = require "resty.rl.decide.matching"
local limiters = require "resty.rl.limit.limiters"
local usage = require "resty.rl.report.usage"

local TODAY = os.date("!%Y-%m-%d", ngx.time())

-- The entry of a monthly quota per tenant (`region`: its option) for the
-- caller key k1 of tenant acme on tier pro.
local function quota_entry(region)
    local conf = config.build({
        key_prefix = "g",
        tiers = { pro = { monthly = 500 } },
        rules = { { name = "m", scope = { "tenant" },
                    limiter = { kind = "quota", limit = "tier.monthly", period = "MONTH",
                                region = region } } },
    })
    local ident = { attrs = { key_id = "k1", tenant = "acme", tier = "pro" },
                    tier_data = conf.tiers.pro, overrides = {}, claims = false }
    return matching.entry(conf, {
        method = function() return "GET" end,
        path = function() return "/v1/things" end,
        header = function() return nil end,
        query_arg = function() return nil end,
        body_arg = function() return nil end,
        client_ip = function() return "10.1.2.3" end,
    }, {}, conf.rules[1], ident)
end

local KEY = "g:{tenant:acme}:m"
local DAY = KEY .. ":day=" .. TODAY

T.test("a regional quota's charge carries REGION, its per-day counter too", function()
    local e = quota_entry(true)
    T.eq(limiters.KINDS.quota.command(e, 3, false, "req-1"),
        { "RL.QUOTA", KEY, 500, "MONTH", "COST", 3, "ALSO", DAY, "1000000000000000", "MONTH",
          "REGION" })
end)

T.test("a regional quota's refund carries REGION", function()
    local e = quota_entry(true)
    T.eq(limiters.KINDS.quota.command(e, 2, false, nil, true),
        { "RL.QUOTA", KEY, 500, "MONTH", "REFUND", 2, "ALSO", DAY, "1000000000000000", "MONTH",
          "REGION" })
end)

T.test("the command a static key shares carries REGION", function()
    local cmd = limiters.command_of(quota_entry(true), 1)
    -- (made once and encoded: its arguments are strings)
    T.eq({ unpack(cmd) }, { "RL.QUOTA", KEY, "500", "MONTH", "COST", "1", "ALSO", DAY,
                            "1000000000000000", "MONTH", "REGION" })
end)

T.test("the usage dashboard's probes of a regional quota read the total", function()
    local _, cmds = usage.probes(quota_entry(true), { "2026-12-01", TODAY })
    T.eq(cmds, {
        { "RL.QUOTA", KEY, 500, "MONTH", "COST", 0, "REGION" },
        { "RL.QUOTA", KEY .. ":day=2026-12-01", "1000000000000000", "MONTH", "COST", 0, "REGION" },
        { "RL.QUOTA", DAY, "1000000000000000", "MONTH", "COST", 0, "REGION" },
    })
end)

T.test("a quota without region (or region = false) sends no REGION", function()
    for _, region in ipairs({ false, "unset" }) do
        local e = quota_entry(region ~= "unset" and region or nil)
        T.eq(limiters.KINDS.quota.command(e, 1, false, "req-1"),
            { "RL.QUOTA", KEY, 500, "MONTH", "COST", 1, "ALSO", DAY, "1000000000000000",
              "MONTH" })
        local _, cmds = usage.probes(e, { TODAY })
        T.eq(cmds, { { "RL.QUOTA", KEY, 500, "MONTH", "COST", 0 },
                     { "RL.QUOTA", DAY, "1000000000000000", "MONTH", "COST", 0 } })
    end
end)
