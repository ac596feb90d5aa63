-- Rule policies of the end-to-end tests (tests/gateway_rules.rs), by name.
local parts = require "rule_policy_parts"
local redis = parts.redis

local M = {}

-- One rule of each kind and identity the examples do not use.
M.kinds = {
    redis = redis, key_prefix = "kinds",
    trusted_proxies = { "127.0.0.1/32" },
    -- an authentication layer in front sets X-Auth-User (and strips it from clients)
    identity = { required = false, headers = { user = "X-Auth-User", tenant = "X-Auth-Org" } },
    routes = { { method = "POST", template = "/v1/psp/charge" },
               { method = "GET", template = "/v1/search" } },
    rules = {
        -- fixed window per user (identity from the auth layer's header)
        { name = "user-fixed", match = { path = "/v1/items" }, scope = { "user" },
          limiter = { kind = "window", mode = "fixed", limit = 3, window = 3600 } },
        -- sliding window per API client (a plain request header)
        { name = "client-sliding", match = { path = "/v1/items" }, scope = { "header:X-Client" },
          limiter = { kind = "window", limit = 4, window = 3600 } },
        -- a query argument as the scope, matched on another argument's value
        { name = "search-per-term", match = { routes = { "GET /v1/search" }, arg = { mode = "deep" } },
          scope = { "arg:q" }, limiter = { kind = "window", mode = "exact", limit = 2, window = 60 } },
        -- shaping in front of a fragile provider: wait rather than fail
        { name = "psp-shaping", match = { routes = { "POST /v1/psp/charge" } }, scope = { "tenant" },
          limiter = { kind = "bucket", rate = 4, burst = 1, period = 1, delay = 2 } },
        -- jitter on Retry-After and strikes with a box, per user
        { name = "user-bucket", match = { path = "/v1/jittery" }, scope = { "user" },
          limiter = { kind = "bucket", rate = 1, burst = 2, period = 60, jitter = 50,
                      strikes = { threshold = 3, window = 60 }, box = { 30, 60, 90 } } },
    },
}

-- The client IP when the connection does not come from a trusted proxy:
-- X-Forwarded-For is ignored (the tests connect from 127.0.0.1, which is
-- not in 10.0.0.0/8); claims of a verified JWT as the scope.
M.untrusted = {
    redis = redis, key_prefix = "untrusted",
    trusted_proxies = { "10.0.0.0/8" },
    identity = { jwt = { secret_env = "RL_JWT_SECRET", claims = { user = "sub" } } },
    rules = {
        { name = "per-ip", match = { path = "/v1/ip" }, scope = { "ip" },
          limiter = { kind = "window", mode = "exact", limit = 2, window = 60 } },
        { name = "per-org", match = { path = "/v1/org" }, scope = { "claim:org" },
          limiter = { kind = "window", mode = "exact", limit = 1, window = 60 } },
    },
}

-- The load test: a bucket and an exact window per key, a daily quota and a
-- lease per tenant, all on one route.
M.mixed = {
    redis = redis, key_prefix = "mixed",
    identity = parts.api_keys("m", 3, "mix"),
    rules = {
        { name = "key-bucket", scope = { "key_id" },
          limiter = { kind = "bucket", rate = 20, burst = 20, period = 1 } },
        { name = "key-window", scope = { "key_id" },
          limiter = { kind = "window", mode = "exact", limit = 40, window = 3600 } },
        { name = "tenant-day", scope = { "tenant" },
          limiter = { kind = "quota", limit = 100, period = "DAY" } },
        { name = "tenant-conc", scope = { "tenant" },
          limiter = { kind = "lease", max = 4, ttl = 30, expected = 1 } },
    },
}

-- Rules of two scopes (two hash tags: two cluster slots): a request the
-- tenant's bucket refuses gives back what the key's rules took.
M.compensated = {
    redis = redis, key_prefix = "comp",
    identity = parts.api_keys("c", 2, "ct"),
    rules = {
        { name = "key-bucket", scope = { "key_id" },
          limiter = { kind = "bucket", rate = 1, burst = 10, period = 3600 } },
        { name = "key-window", scope = { "key_id" },
          limiter = { kind = "window", mode = "exact", limit = 10, window = 3600 } },
        { name = "key-conc", scope = { "key_id" },
          limiter = { kind = "lease", max = 1, ttl = 60, expected = 1 } },
        { name = "monthly", scope = { "tenant" },
          limiter = { kind = "quota", limit = 100, period = "MONTH" } },
        { name = "tenant-bucket", scope = { "tenant" },
          limiter = { kind = "bucket", rate = 1, burst = 2, period = 3600 } },
    },
}

return M
