-- resty.rl.fallback: the local limiter used when Redis fails on a
-- non-critical route. One token bucket per API key and per tenant, in this
-- worker's memory only (an LRU cache bounds it), at a fraction of the tier
-- (fallback_ratio, 25% by default): with N workers a caller gets at most N
-- times that while Redis is away.

local lrucache = require "resty.lrucache"

local _M = {}

-- One cache per configuration, weak-keyed: a configuration dropped (Kong
-- builds a new one on every change) takes its cache with it.
local caches = setmetatable({}, { __mode = "k" })

--- The LRU cache of `conf` in `registry` (a weak-keyed table), made on
--- first use with conf.fallback_entries entries.
function _M.lru_for(registry, conf)
    local c = registry[conf]
    if not c then
        c = assert(lrucache.new(conf.fallback_entries))
        registry[conf] = c
    end
    return c
end

local function cache_for(conf)
    return _M.lru_for(caches, conf)
end

--- The budget of the local limiter for one of a tier's budgets.
function _M.scaled(conf, budget)
    return {
        rate = math.max(math.floor(budget.rate * conf.fallback_ratio), 1),
        burst = math.max(math.floor(budget.burst * conf.fallback_ratio), 1),
    }
end

-- The bucket's points now (refilled since its last update).
local function level(b, now, cap, rate, period)
    local pts = b.points + (now - b.at) * rate / period
    if pts > cap then
        pts = cap
    end
    return pts
end

--- Takes `cost` points from every bucket of `buckets` (each {name, rate,
--- burst}, with the tier's `period`) or from none. Returns allowed (bool),
--- the index of the binding bucket, its points left (whole) and the ms
--- until `cost` fits (0 when allowed).
function _M.take(conf, buckets, period, cost)
    local cache = cache_for(conf)
    local now = ngx.now()
    local state, levels = {}, {}
    local allowed, binding, worst = true, 1, -1
    for i, b in ipairs(buckets) do
        local s = cache:get(b.name)
        if not s then
            s = { points = b.burst, at = now }
        end
        state[i] = s
        levels[i] = level(s, now, b.burst, b.rate, period)
        if levels[i] < cost then
            allowed = false
            local wait = (cost - levels[i]) * period / b.rate
            if wait > worst then
                worst, binding = wait, i
            end
        end
    end
    if allowed then
        local fewest
        for i, b in ipairs(buckets) do
            local s = state[i]
            s.points, s.at = levels[i] - cost, now
            -- kept at least until the bucket would be full again (an
            -- entry dropped earlier would come back full too soon)
            cache:set(b.name, s, math.ceil(b.burst * period / b.rate) + 1)
            if not fewest or s.points < fewest then
                fewest, binding = s.points, i
            end
        end
        return true, binding, math.floor(levels[binding] - cost), 0
    end
    return false, binding, math.floor(levels[binding]), math.ceil(worst * 1000)
end

return _M
