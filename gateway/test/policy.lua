-- The policy of the end-to-end tests (tests/gateway*.rs): the sample
-- policy's routes, strike thresholds, boxes and concurrency, with small
-- budgets so that a test reaches its limits in a few requests. Returns a
-- function: overrides (top-level options) -> configuration.

-- A tier: {rate, burst} a minute per key and per tenant, the strikes
-- threshold (in 60 s), the level-3 box (0: manual), the lease maxima.
local function tier(key, tenant, strikes, level3, concurrency)
    return { key = { rate = key[1], burst = key[2] },
             tenant = { rate = tenant[1], burst = tenant[2] }, period = 60, strikes = { threshold = strikes, window = 60 },
             box = { 300, 3600, level3 }, offenses_ttl = 86400, concurrency = concurrency }
end

return function(overrides)
    local p = {
        -- a generous budget: the tests run on a loaded 2-core machine
        redis = { timeout_ms = 250 },
        client_ip_header = "X-Test-Client-Ip",
        -- a cached box is trusted 10 s (the default is 2): the tests that
        -- count Redis calls while a key is boxed take seconds on a loaded
        -- machine (they release boxes with INCR rl:deny:version)
        deny_cache = { recheck = 10 },
        identity = {
            keys = {
                ["k-sandbox"] = { tenant = "sbx", tier = "sandbox", key_id = "s1" },
                ["k-growth"] = { tenant = "acme", tier = "growth", key_id = "g1" },
                ["k-growth-2"] = { tenant = "acme", tier = "growth", key_id = "g2" },
                ["k-ent"] = { tenant = "bigco", tier = "enterprise", key_id = "e1" },
                ["k-load-1"] = { tenant = "loadco", tier = "load", key_id = "l1" },
                ["k-load-2"] = { tenant = "loadco", tier = "load", key_id = "l2" },
            },
        },
        tiers = {
            -- 1 point per minute: no refill to speak of during a test; every
            -- burst holds the dearest request (50 points)
            sandbox = tier({ 1, 50 }, { 600, 600 }, 20, 86400, { reconcile = 1, export = 1 }),
            growth = tier({ 1, 100 }, { 1, 150 }, 20, 86400, { reconcile = 2, export = 1 }),
            enterprise = tier({ 1, 50 }, { 600, 600 }, 100, 0, { reconcile = 8, export = 3 }),
            -- the load test: 100 points/s per key, 150/s per tenant
            load = tier({ 6000, 50 }, { 9000, 75 }, 1000000000, 86400,
                { reconcile = 1, export = 1 }),
        },
    }
    for k, v in pairs(overrides or {}) do
        if k == "redis" then
            for rk, rv in pairs(v) do
                p.redis[rk] = rv
            end
        else
            p[k] = v
        end
    end
    return p
end
