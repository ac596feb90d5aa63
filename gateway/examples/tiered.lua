-- The tiered quotas design: a rule policy.
-- Free / Developer / Business / Enterprise, each with a monthly quota of
-- requests and of data egress (403 with an upgrade link when spent), a steady rate and burst per key
-- (429 with Retry-After; no strikes), concurrent requests per key, and a
-- priority for graceful degradation: sent upstream as X-RateLimit-Priority
-- (for the upstream's load shedding), and when Redis fails the Free tier
-- is shed (503) while paid tiers run on the local limiter. API keys, their
-- tier (a tenant's `tier` field) and per-tenant overrides (monthly, ...)
-- come from the identity store, so an upgrade takes effect within
-- seconds. RL_REDIS_HOST / RL_REDIS_PORT name Redis.
-- Monthly egress: the response body bytes, counted after each response
-- (a request is refused once the month's bytes are used up).
-- Approaching quota thresholds: each monthly quota at 80, 90 and 100 %
-- appends an event to rl:events:quota, from which `rlctl watch` sends the
-- tenant's webhook and mail (rlctl/README.md, "Quota events").
-- Several regions: RL_REGIONS=1 counts both monthly quotas per region
-- (`region = true`: RL.QUOTA ... REGION on this region's Redis, decided on
-- the total of every region's; gateway/README.md, "Several regions").
local REGIONS = os.getenv("RL_REGIONS") == "1"
local UPGRADE = "https://dashboard.example.com/billing/upgrade"
local DASHBOARD = "https://dashboard.example.com/usage"

return {
    -- one server, Sentinel or Cluster as RL_REDIS_MODE and its companions
    -- say (resty.rl.redis.env); the design's 20 ms budget unless
    -- RL_REDIS_TIMEOUT_MS gives another
    redis = require("resty.rl.redis.env").redis({ timeout_ms = 20 }),
    key_prefix = "tq",
    identity = {
        required = true,
        api_key = {
            header = "X-Api-Key",
            keys = { ["demo-free-key"] = { tenant = "app-1", tier = "free", key_id = "f-1" } },
        },
        store = true,
        cache_ttl = 2,
    },
    default_tier = "free",
    -- monthly: requests a month; egress_bytes: response body bytes a month;
    -- rate / burst: requests a second per key; concurrency: requests in
    -- flight per key; priority: for the upstream's load shedding
    tiers = {
        free = { monthly = 10000, egress_bytes = 1000000000, rate = 1, burst = 10,
                 concurrency = 2, priority = 0, degraded = "closed" },
        developer = { monthly = 100000, egress_bytes = 10000000000, rate = 10, burst = 50,
                      concurrency = 5, priority = 1, degraded = "local" },
        business = { monthly = 2000000, egress_bytes = 200000000000, rate = 100, burst = 300,
                     concurrency = 20, priority = 2, degraded = "local" },
        enterprise = { monthly = 50000000, egress_bytes = 5000000000000, rate = 1000,
                       burst = 3000, concurrency = 100, priority = 3, degraded = "local" },
    },
    upstream_headers = { ["X-RateLimit-Priority"] = "tier.priority",
                         ["X-RateLimit-Tier"] = "attr:tier" },
    rules = {
        {
            name = "{tier}-monthly", scope = { "tenant" },
            limiter = { kind = "quota", limit = "tier.monthly", period = "MONTH", region = REGIONS },
            quota_alerts = { thresholds = { 80, 90, 100 } },
            on_refusal = { action = "quota", status = 403, upgrade_url = UPGRADE,
                message = "The monthly quota of your plan is used up; upgrade for more." },
            on_redis_failure = "tier.degraded",
        },
        {
            name = "{tier}-egress", scope = { "tenant" }, count = "response_bytes",
            limiter = { kind = "quota", limit = "tier.egress_bytes", period = "MONTH",
                        region = REGIONS },
            quota_alerts = { thresholds = { 80, 90, 100 } },
            on_refusal = { action = "quota", status = 403, upgrade_url = UPGRADE,
                message = "The monthly data egress of your plan is used up; upgrade for more." },
            on_redis_failure = "tier.degraded",
        },
        {
            name = "{tier}-rate", scope = { "key_id" },
            limiter = { kind = "bucket", rate = "tier.rate", burst = "tier.burst", period = 1 },
            -- the design's descriptive 429: usage is in the RateLimit fields
            on_refusal = { fields = { dashboard_url = DASHBOARD } },
            on_redis_failure = "tier.degraded",
        },
        {
            name = "{tier}-concurrency", scope = { "key_id" },
            limiter = { kind = "lease", max = "tier.concurrency", ttl = 60, expected = 1 },
            on_redis_failure = "tier.degraded",
        },
    },
}
