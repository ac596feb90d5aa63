-- resty.rl.limit.fallback: the local limiter used when Redis fails on a
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

-- A budget of the local limiter: `ratio` of a bucket's or window's
-- capacity and rate (at least 1 each).
local function scaled_budget(p, ratio)
    return math.max(math.floor((p.burst or p.limit) * ratio), 1),
        math.max(math.floor((p.rate or p.limit) * ratio), 1)
end

--- Decides entry `e` (a bucket or window rule of a rule policy, with its
--- ALSO buckets) on the local limiter while Redis fails: every bucket at
--- fallback_ratio of its capacity and rate, taken together (all or
--- none); the entry's names get "-degraded", its limiter the scaled
--- budgets (for RateLimit-Policy), and its outcome the binding bucket.
function _M.decide_entry(conf, e)
    local p, ratio = e.params, conf.fallback_ratio
    local window = p.period or p.window
    local cap, rate = scaled_budget(p, ratio)
    local local_params = { kind = p.kind, burst = cap, rate = rate, period = p.period,
                           limit = p.limit and cap, window = p.window }
    local buckets = { { name = e.key, rate = rate, burst = cap } }
    local names = { e.name .. "-degraded" }
    local also = p.also
    if also then
        local_params.also = {}
        for i, a in ipairs(also) do
            local acap, arate = scaled_budget(a, ratio)
            local_params.also[i] = { burst = acap, rate = arate, period = a.period,
                                     limit = a.limit and acap, window = a.window }
            buckets[i + 1] = { name = e.also_keys[i], rate = arate, burst = acap }
            names[i + 1] = e.also_names[i] .. "-degraded"
        end
    end
    local smallest = cap
    for _, b in ipairs(buckets) do
        smallest = math.min(smallest, b.burst)
    end
    local ok, b, remaining, wait_ms = _M.take(conf, buckets, window, math.min(e.cost, smallest))
    local bucket = buckets[b]
    e.name, e.params, e.static = names[1], local_params, false
    if also then
        local also_names = {}
        for i = 2, #names do
            also_names[i - 1] = names[i]
        end
        e.also_names = also_names
    end
    e.outcome = { state = ok and "allowed" or "refused", retry_ms = wait_ms,
        binding = { name = names[b], limit = bucket.burst, remaining = remaining,
                    reset_ms = math.ceil((bucket.burst - remaining) * window * 1000 / bucket.rate),
                    window = window, unit = e.rule.unit } }
    e.degraded_bucket = b
end

return _M
