-- A region's allowance (`allowance.home`, `allowance.borrow`): the options
-- completed at start (the home's redis table over the policy's, fetched
-- ahead by default) and each bad one refused with an error naming it.
local T = require "unit"
local config = require "resty.rl.config"

-- A policy of one bucket rule "alpha" whose allowance is `a`.
local function with(a)
    return {
        redis = { host = "127.0.0.1", port = 6379, timeout_ms = 30 },
        rules = { {
            name = "alpha", scope = { "key_id" },
            limiter = { kind = "bucket", rate = 10, burst = 20 },
            allowance = a,
        } },
    }
end

local function good()
    return with({ size = 6, home = { host = "10.0.0.9", port = 7000 }, borrow = 4 })
end

T.test("a home completes from the policy's redis and fetches ahead", function()
    local a = config.build(good()).rules[1].allowance
    local h = a.home_conf.redis
    T.eq({ h.mode, h.host, h.port, h.timeout_ms, a.home_id, a.refill_below, a.borrow },
        { "single", "10.0.0.9", 7000, 30, "single/10.0.0.9:7000", 3, 4 })
    -- the other fields are the policy's
    T.eq(a.home_conf.key_prefix, "rl")
end)

T.test("without home nothing is borrowed and nothing fetched ahead", function()
    local a = config.build(with({ size = 6 })).rules[1].allowance
    T.eq({ a.borrow, a.refill_below, a.home_conf }, { 0, 0, nil })
end)

local R = "rules[1] (alpha)"

local function set(fields)
    return function(p)
        for k, v in pairs(fields) do
            p.rules[1].allowance[k] = v
        end
    end
end

T.cases("a bad home or borrow option is named", {
    { name = "borrow without home", mod = function(p)
        p.rules[1].allowance = { size = 6, borrow = 2 }
    end, err = R .. ": allowance.borrow needs allowance.home" },
    { name = "borrow negative", mod = set({ borrow = -1 }),
      err = R .. ": allowance.borrow must be an integer >= 0 (points)" },
    { name = "borrow fractional", mod = set({ borrow = 1.5 }),
      err = R .. ": allowance.borrow must be an integer >= 0 (points)" },
    { name = "home not a table", mod = set({ home = "10.0.0.9" }),
      err = R .. ": allowance.home must be a table of redis fields (host, port, mode, nodes, ...)" },
    { name = "an unknown home field", mod = set({ home = { host = "h", hots = 1 } }),
      err = R .. ": allowance.home.hots is not a redis field" },
    { name = "home port", mod = set({ home = { host = "h", port = 70000 } }),
      err = R .. ": allowance.home.host must be a string and allowance.home.port a port" },
    { name = "home timeout", mod = set({ home = { host = "h", timeout_ms = 0 } }),
      err = R .. ": allowance.home.timeout_ms must be > 0" },
    { name = "home mode", mod = set({ home = { host = "h", mode = "ring" } }),
      err = R .. ": allowance.home.mode must be single, cluster or sentinel" },
    { name = "home sentinel without sentinels", mod = set({ home = { mode = "sentinel" } }),
      err = R .. ": allowance.home in sentinel mode needs sentinels and master_name" },
    { name = "home cluster without its own dict", mod = function(p)
        p.redis = { mode = "cluster", nodes = { "127.0.0.1:7000" } }
        p.rules[1].allowance.home = { mode = "cluster", nodes = { "10.0.0.9:7000" } }
    end, err = R .. ": allowance.home in cluster mode needs nodes and a dict of its own "
        .. "(allowance.home.dict, a lua_shared_dict)" },
}, T.refusing(good, config.build, "rl config: "))
