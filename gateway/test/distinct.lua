-- Rule policies of tests/gateway_distinct.rs, by name: distinct-member
-- rules with small numbers, and quota threshold events.
local parts = require "rule_policy_parts"
local redis = parts.redis
local TOKEN = "POST /v1/auth/token"

local M = {}

-- Credential stuffing with small numbers, and distinct members per request.
M.stuffing = {
    redis = redis, key_prefix = "stuff",
    trusted_proxies = { "127.0.0.1" },
    identity = { required = false },
    routes = { { method = "POST", template = "/v1/auth/token", public = true },
               { method = "GET", template = "/v1/clients" } },
    rules = {
        -- 3 or more distinct subjects and 7 or more failures from one IP in
        -- 10 minutes: level 3 on the IP for a minute
        { name = "stuffing-ip", match = { routes = { TOKEN } }, scope = { "ip" },
          count = "failures", fail_statuses = { 401, 403, 429 },
          limiter = { kind = "distinct", member = "subject", limit = 2, window = 600,
                      min_events = 7, trip = { level = 3, duration = 60 } },
          alerts = { from_level = 3 } },
        -- one subject failing from 3 or more IPs: a manual level-3 box
        { name = "stuffing-subject", match = { routes = { TOKEN } }, scope = { "subject" },
          count = "failures", fail_statuses = { 401, 429 },
          limiter = { kind = "distinct", member = "ip", limit = 2, window = 600,
                      trip = { level = 3, duration = 0 } } },
        -- at most 2 client ids per tenant a minute (every request counts)
        { name = "clients", match = { routes = { "GET /v1/clients" } }, scope = { "header:X-Tenant" },
          limiter = { kind = "distinct", member = "header:X-Client", limit = 2, window = 60 } },
    },
}

-- A monthly quota of 10 per tenant with events at 50 % and 100 %.
M.quota = {
    redis = redis, key_prefix = "qa",
    identity = parts.api_keys("q", 2, "t-1"),
    rules = {
        { name = "monthly", scope = { "tenant" },
          limiter = { kind = "quota", limit = 10, period = "MONTH" },
          quota_alerts = { thresholds = { 50, 100 } } },
    },
}

return M
