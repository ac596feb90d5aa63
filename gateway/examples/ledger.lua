-- The payments ledger design: a rule policy.
-- Load it with resty.rl.nginx.configure("api", dofile(".../ledger.lua"))
-- (see gateway/README.md, "The shipped examples"); RL_REDIS_HOST and
-- RL_REDIS_PORT name Redis with the rl module.
--
--   * per API key and per tenant, one cost-weighted token bucket each, both
--     in one RL.TAKE (all or nothing, the stricter wins), with strikes and
--     the three-level box; level 2 and 3 trips go to the alert stream;
--     Enterprise pages at level 3 instead of suspending the key;
--   * endpoint costs: 1 (CRUD), 10 (reconcile), 25 / 50 beyond 90 days
--     (audit export);
--   * reconcile: one per ledger (409) and 1 / 2 / 8 per tenant (429);
--     export: 1 / 1 / 3 per tenant, and 2 / 10 / 60 per tenant per hour;
--   * POST /v1/auth/token: only failures count, 5 per subject and 20 per
--     IP in 15 minutes, locked out 15 min, 1 h, 1 day;
--   * credential stuffing (RL.DISTINCT): 500 or more failed auths across
--     50 or more distinct subjects from one IP in 10 minutes, or one
--     subject failing from 20 or more IPs in 10 minutes, trips level 3 (a
--     day) on the IP or the subject; a lockout's 429 counts as a failed
--     attempt too, so an attacker who keeps trying through the lockouts
--     reaches it; level 3 goes to the alert stream;
--   * problem+json bodies with the design's fields.
local DAY = 86400
local CRUD = { "GET /v1/ledgers", "GET /v1/ledgers/{id}", "GET /v1/ledgers/{id}/entries",
               "POST /v1/ledgers/{id}/entries", "other" }
local RECONCILE, EXPORT, TOKEN = "POST /v1/ledgers/reconcile", "GET /v1/reports/audit-export",
    "POST /v1/auth/token"
local ALL_API = { RECONCILE, EXPORT }
for _, r in ipairs(CRUD) do
    ALL_API[#ALL_API + 1] = r
end

return {
    -- one server, Sentinel or Cluster as RL_REDIS_MODE and its companions
    -- say (resty.rl.redis.env); the design's 20 ms budget unless
    -- RL_REDIS_TIMEOUT_MS gives another
    redis = require("resty.rl.redis.env").redis({ timeout_ms = 20 }),
    key_prefix = "ledger",
    -- the load balancer in front; X-Forwarded-For is read behind it only
    trusted_proxies = { "127.0.0.1" },
    identity = {
        required = true,
        -- API keys: these, and the identity store in Redis (cached 2 s)
        api_key = {
            header = "X-Api-Key",
            keys = {
                ["demo-sandbox-key"] = { tenant = "t-100", tier = "sandbox", key_id = "k-1" },
                ["demo-growth-key"] = { tenant = "t-200", tier = "growth", key_id = "k-2" },
                ["demo-enterprise-key"] = { tenant = "t-300", tier = "enterprise", key_id = "k-3" },
            },
        },
        store = true,
        cache_ttl = 2,
    },
    tiers = {
        sandbox = {
            key_rate = 300, key_burst = 300, tenant_rate = 600, tenant_burst = 600,
            strikes = { threshold = 20, window = 60 }, box = { 300, 3600, 0 }, level3 = "suspend",
            reconcile = 1, export = 1, exports_per_hour = 2,
        },
        growth = {
            key_rate = 3000, key_burst = 3000, tenant_rate = 6000, tenant_burst = 6000,
            strikes = { threshold = 20, window = 60 }, box = { 300, 3600, 0 }, level3 = "suspend",
            reconcile = 2, export = 1, exports_per_hour = 10,
        },
        enterprise = {
            key_rate = 12000, key_burst = 12000, tenant_rate = 60000, tenant_burst = 60000,
            -- level 3 pages the on-call and the account owner: a 1-hour box, no suspension
            strikes = { threshold = 100, window = 60 }, box = { 300, 3600, 3600 }, level3 = "page",
            reconcile = 8, export = 3, exports_per_hour = 60,
        },
    },
    routes = {
        { method = "POST", template = "/v1/ledgers/reconcile", cost = 10, critical = true },
        { method = "GET", template = "/v1/reports/audit-export", cost = 25, critical = true,
          range = { from_arg = "from", to_arg = "to", max_days = 90, cost = 50 } },
        { method = "POST", template = "/v1/auth/token", critical = true, public = true },
        { method = "GET", template = "/v1/ledgers" },
        { method = "GET", template = "/v1/ledgers/{id}" },
        { method = "GET", template = "/v1/ledgers/{id}/entries" },
        { method = "POST", template = "/v1/ledgers/{id}/entries" },
    },
    rules = {
        {
            name = "{tier}-key", match = { routes = ALL_API },
            scope = { "tenant", "key_id" }, cost = "route",
            limiter = {
                kind = "bucket", rate = "tier.key_rate", burst = "tier.key_burst", period = 60,
                strikes = "tier.strikes", box = "tier.box", offenses_ttl = DAY, jitter = 10,
                also = { { name = "{tier}-tenant", scope = { "tenant" }, rate = "tier.tenant_rate",
                           burst = "tier.tenant_burst", period = 60 } },
            },
            alerts = { from_level = 2, level3 = "tier.level3" },
        },
        {
            name = "reconcile-ledger", match = { routes = { RECONCILE } },
            scope = { "tenant", "arg:ledger_id" },
            limiter = { kind = "lease", max = 1, ttl = 300, expected = 5 },
            on_refusal = { status = 409 },
        },
        {
            name = "reconcile-tenant", match = { routes = { RECONCILE } }, scope = { "tenant" },
            limiter = { kind = "lease", max = "tier.reconcile", ttl = 300, expected = 5 },
        },
        {
            name = "export-tenant", match = { routes = { EXPORT } }, scope = { "tenant" },
            limiter = { kind = "lease", max = "tier.export", ttl = 600, expected = 30 },
        },
        {
            name = "export-hourly", match = { routes = { EXPORT } }, scope = { "tenant" },
            limiter = { kind = "window", mode = "exact", limit = "tier.exports_per_hour",
                        window = 3600 },
        },
        {
            name = "auth-subject", match = { routes = { TOKEN } }, scope = { "subject" },
            count = "failures", fail_statuses = { 401, 403 },
            -- one attempt in flight per subject: parallel guesses wait for
            -- the previous failure to be counted
            one_in_flight = { ttl = 30, wait_ms = 500, retry_after = 1 },
            limiter = { kind = "window", mode = "exact", limit = 5, window = 900,
                        strikes = { threshold = 1, window = 900 }, box = { 900, 3600, DAY } },
        },
        {
            name = "auth-ip", match = { routes = { TOKEN } }, scope = { "ip" },
            count = "failures", fail_statuses = { 401, 403 },
            limiter = { kind = "window", mode = "exact", limit = 20, window = 900,
                        strikes = { threshold = 1, window = 900 }, box = { 900, 3600, DAY } },
        },
        {
            -- "limit" is what is allowed: the 50th distinct subject is one too many
            name = "stuffing-ip", match = { routes = { TOKEN } }, scope = { "ip" },
            count = "failures", fail_statuses = { 401, 403, 429 },
            limiter = { kind = "distinct", member = "subject", limit = 49, window = 600,
                        min_events = 500, trip = { level = 3, duration = DAY } },
            alerts = { from_level = 3 },
        },
        {
            name = "stuffing-subject", match = { routes = { TOKEN } }, scope = { "subject" },
            count = "failures", fail_statuses = { 401, 403, 429 },
            limiter = { kind = "distinct", member = "ip", limit = 19, window = 600,
                        trip = { level = 3, duration = DAY } },
            alerts = { from_level = 3 },
        },
    },
}
