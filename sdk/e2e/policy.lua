-- The policy of the SDK end-to-end tests (sdk/python/tests/e2e,
-- sdk/typescript/test/e2e): small buckets that refill at 1 point a second,
-- the sample's strike threshold (20 in 60 s), short boxes so that a test
-- can wait one out. Each scenario has its own API key and tenant, so that
-- scenarios never share a bucket. Returns a function: redis port ->
-- configuration.
local function tier(box1)
    return {
        key = { rate = 60, burst = 5 }, tenant = { rate = 6000, burst = 6000 }, period = 60,
        strikes = { threshold = 20, window = 60 }, box = { box1, 3600, 86400 },
        offenses_ttl = 86400, concurrency = { reconcile = 4, export = 1 },
    }
end

-- a scenario run by several clients (httpx sync and async, requests) has
-- one key each: "lock", "lock-async", "lock-requests", ...
local scenarios = {}
for _, name in ipairs({ "honour", "paced", "rude", "lock", "dated", "idem", "conflict" }) do
    for _, suffix in ipairs({ "", "-async", "-requests" }) do
        scenarios[#scenarios + 1] = name .. suffix
    end
end

return function(redis_port)
    local keys = {}
    for _, name in ipairs(scenarios) do
        keys["k-" .. name] = { tenant = "t-" .. name, key_id = name,
            tier = name:find("^dated") and "dated" or "steady" }
    end
    return {
        redis = { port = redis_port, timeout_ms = 250 },
        -- boxes of 5 s or more get an HTTP-date Retry-After: the "dated"
        -- tier's 6 s box does, the "steady" tier's 4 s box does not
        http_date_after = 5,
        identity = { keys = keys },
        tiers = { steady = tier(4), dated = tier(6) },
        routes = {
            {
                method = "POST", template = "/v1/ledgers/reconcile", cost = 1, critical = true,
                leases = {
                    { name = "reconcile-ledger", scope = "arg", arg = "ledger_id", max = 1,
                      status = 409, ttl = 60 },
                },
            },
            { method = "POST", template = "/v1/auth/token", auth = true, critical = true },
            { method = "GET", template = "/v1/ledgers", cost = 1 },
            { method = "GET", template = "/v1/ledgers/{id}", cost = 1 },
            { method = "POST", template = "/v1/ledgers/{id}/entries", cost = 1 },
        },
    }
end
