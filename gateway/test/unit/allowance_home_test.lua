-- A region's allowance (`allowance.home`, `allowance.borrow`): the options
-- completed at start (the home's redis table over the policy's, fetched
-- ahead by default) and each bad one refused with an error naming it.
local T = require "unit"
local config = require "resty.rl.policy.config"

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

-- Each case's error follows "rules[1] (alpha): allowance." (the option
-- named from the rule's allowance on).
T.cases("a bad home or borrow option is named", {
    { name = "borrow without home", mod = function(p)
        p.rules[1].allowance = { size = 6, borrow = 2 }
    end, err = "borrow needs allowance.home" },
    { name = "borrow negative", mod = set({ borrow = -1 }),
      err = "borrow must be an integer >= 0 (points)" },
    { name = "borrow fractional", mod = set({ borrow = 1.5 }),
      err = "borrow must be an integer >= 0 (points)" },
    { name = "home not a table", mod = set({ home = "10.0.0.9" }),
      err = "home must be a table of redis fields (host, port, mode, nodes, ...)" },
    { name = "an unknown home field", mod = set({ home = { host = "h", hots = 1 } }),
      err = "home.hots is not a redis field" },
    { name = "home port", mod = set({ home = { host = "h", port = 70000 } }),
      err = "home.host must be a string and allowance.home.port a port" },
    { name = "home timeout", mod = set({ home = { host = "h", timeout_ms = 0 } }),
      err = "home.timeout_ms must be > 0" },
    { name = "home mode", mod = set({ home = { host = "h", mode = "ring" } }),
      err = "home.mode must be single, cluster or sentinel" },
    { name = "home sentinel without sentinels", mod = set({ home = { mode = "sentinel" } }),
      err = "home in sentinel mode needs sentinels and master_name" },
    { name = "home cluster without its own dict", mod = function(p)
        p.redis = { mode = "cluster", nodes = { "127.0.0.1:7000" } }
        p.rules[1].allowance.home = { mode = "cluster", nodes = { "10.0.0.9:7000" } }
    end, err = "home in cluster mode needs nodes and a dict of its own "
        .. "(allowance.home.dict, a lua_shared_dict)" },
}, T.refusing(good, config.build, "rl config: " .. R .. ": allowance."))

-- ngx.timer replaced for `fn`: the timers asked for are recorded (never
-- run); the stub's refusing one put back after.
local function with_timers(fn)
    local stub, started = ngx.timer, {}
    ngx.timer = {
        at = function(_, f) started[#started + 1] = f; return true end,
        every = function() return true end,
    }
    local ok, err = pcall(fn, started)
    ngx.timer = stub
    assert(ok, err)
end

T.test("a region's node borrows only while the home is away, then the charge goes first", function()
    with_timers(function(started)
        local conf = config.build(good())
        local allowance = require "resty.rl.limit.allowance"
        local d = ngx.shared.rl_allowance
        d:flush_all()
        local key = "rl:{key_id:k1}:alpha"
        local function request()
            local e = { rule = conf.rules[1], key = key, cost = 1, name = "alpha",
                        params = { burst = 20, rate = 10, period = 60 } }
            T.eq(allowance.spent(conf, e), true, "decided without a Redis call")
            return e.outcome.state, e.outcome.retry_ms
        end
        -- nothing held, the home not known away: refused, a fetch started
        T.eq({ request() }, { "refused", 1000 })
        T.eq(#started, 1)
        -- a fetch without a reply marked the home away: 4 borrowed, then refused
        d:set("u:" .. key, true)
        for _ = 1, 4 do
            T.eq(request(), "allowed")
        end
        T.eq({ request() }, { "refused", 1000 })
        T.eq(d:get("o:" .. key), 4)
        -- still away: the next fetch charges nothing
        local e = { rule = conf.rules[1], key = key, params = { burst = 20, rate = 10, period = 60 } }
        local cmds, owed = allowance.fetch_commands(d, e)
        T.eq({ #cmds, owed }, { 1, 0 })
        -- back: the charge first, in the same round trip, taken out of the dict
        d:delete("u:" .. key)
        cmds, owed = allowance.fetch_commands(d, e)
        T.eq(cmds, { { "RL.TAKE", key, 20, 10, 60, "COST", 4, "DEBT" },
                     { "RL.TAKE", key, 20, 10, 60, "COST", 6, "PARTIAL", "MIN", 1 } })
        T.eq({ owed, d:get("o:" .. key) }, { 4, 0 })
        -- a second fetch does not charge it again
        cmds, owed = allowance.fetch_commands(d, e)
        T.eq({ #cmds, owed }, { 1, 0 })
    end)
end)
