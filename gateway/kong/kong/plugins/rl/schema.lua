-- Kong plugin "rl": configuration schema. The options are those of
-- resty.rl.policy.config (gateway/REFERENCE.md documents each); an option left unset
-- takes the library's default, and `tiers`, `routes` and `auth` left unset
-- take the tier form's sample (resty.rl.policy.tier_form). The tier form is
-- translated into a rule policy when the plugin's configuration is built,
-- as the nginx front end's is.

local typedefs = require "kong.db.schema.typedefs"
local cjson = require "cjson.safe"

-- A rule policy (gateway/REFERENCE.md, "Rule policies") as JSON: the
-- same rules as the nginx front end's Lua table, validated by the same
-- code when Kong checks the plugin configuration (errors name the field).
local function valid_policy(text)
    local policy, err = cjson.decode(text)
    if type(policy) ~= "table" then
        return nil, "policy is not a JSON object: " .. tostring(err)
    end
    local ok, build_err = pcall(require("resty.rl.policy.config").build, policy)
    if not ok then
        return nil, tostring(build_err)
    end
    return true
end

-- A tier-form `allowance` (gateway/REFERENCE.md, "Local allowances" and "A
-- region's allowance"), validated by the library's own code on the sample
-- tiers and routes, so that its errors name the option
-- ("allowance.borrow needs allowance.home").
local function valid_allowance(a)
    local given = require("resty.rl.policy.tier_form").without_nulls(a)
    if given == nil then
        return true
    end
    if given.size == nil then
        -- the tier form has no allowance without its size: say so rather than drop the rest
        return nil, "allowance.size is needed with the other allowance options"
    end
    local ok, err = pcall(require("resty.rl.policy.config").build, { allowance = given })
    if not ok then
        return nil, (tostring(err):gsub("^rl config: rules%[%d+%] %([^)]*%): ", ""))
    end
    return true
end

-- Field definitions are built by functions: each use gets its own table
-- (Kong annotates field tables when it loads a schema).

-- A budget: points per period, and the burst.
local function budget()
    return {
        type = "record",
        fields = {
            { rate = { type = "integer", required = true, gt = 0 } },
            { burst = { type = "integer", required = true, gt = 0 } },
        },
    }
end

-- Box durations of levels 1, 2, 3 in seconds (0: manual).
local function durations()
    return { type = "array", len_eq = 3,
             elements = { type = "number", between = { 0, 31536000 } } }
end

local tier = {
    type = "record",
    fields = {
        { key = budget() },
        { tenant = budget() },
        { period = { type = "number", default = 60, gt = 0 } },
        { strikes = { type = "record", fields = {
            { threshold = { type = "integer", required = true, gt = 0 } },
            { window = { type = "number", required = true, gt = 0 } },
        } } },
        { box = durations() },
        { offenses_ttl = { type = "number", default = 86400, gt = 0 } },
        { concurrency = { type = "map", keys = { type = "string" },
                          values = { type = "integer", gt = 0 } } },
    },
}

local lease = {
    type = "record",
    fields = {
        { name = { type = "string", required = true } },
        { scope = { type = "string", required = true, one_of = { "tenant", "arg" } } },
        { arg = { type = "string" } },
        { max = { type = "integer", gt = 0 } },
        { status = { type = "integer", default = 429, one_of = { 409, 429 } } },
        { ttl = { type = "number", default = 300, gt = 0 } },
        -- how long the work usually takes: the Retry-After of a full lease
        { expected = { type = "number", gt = 0 } },
    },
}

local route = {
    type = "record",
    fields = {
        { method = typedefs.http_method },
        { template = { type = "string", required = true, starts_with = "/" } },
        { cost = { type = "integer", gt = 0 } },
        { critical = { type = "boolean", default = false } },
        -- the route's own Redis budget (ms), over redis.timeout_ms
        { timeout_ms = { type = "number", gt = 0 } },
        { auth = { type = "boolean", default = false } },
        { range = { type = "record", fields = {
            { from_arg = { type = "string", default = "from" } },
            { to_arg = { type = "string", default = "to" } },
            { max_days = { type = "integer", default = 90, gt = 0 } },
            { cost = { type = "integer", required = true, gt = 0 } },
        } } },
        { leases = { type = "array", elements = lease } },
    },
}

-- A failed-login window with its default limit (per 15 minutes).
local function window(limit)
    return {
        type = "record",
        fields = {
            { limit = { type = "integer", default = limit, gt = 0 } },
            { window = { type = "number", default = 900, gt = 0 } },
        },
    }
end

-- The fields of a Redis connection (the policy's `redis` table), with
-- the defaults `d` (none for a region's home: a field left out is the
-- plugin's own).
local function redis_fields(d)
    d = d or {}
    return {
        { host = typedefs.host { default = d.host } },
        { port = typedefs.port { default = d.port } },
        { password = { type = "string", referenceable = true, encrypted = true } },
        { database = { type = "integer", between = { 0, 15 } } },
        { timeout_ms = { type = "number", default = d.timeout_ms, gt = 0 } },
        { pool_size = { type = "integer", default = d.pool_size, gt = 0 } },
        { keepalive_ms = { type = "integer", default = d.keepalive_ms, gt = 0 } },
        { mode = { type = "string", default = d.mode, one_of = { "single", "cluster", "sentinel" } } },
        -- cluster seeds / sentinels, each "host:port"
        { nodes = { type = "array", elements = { type = "string" } } },
        { sentinels = { type = "array", elements = { type = "string" } } },
        { master_name = { type = "string", default = d.master_name } },
        { sentinel_password = { type = "string", referenceable = true, encrypted = true } },
        { dict = { type = "string", default = d.dict } },
        { refresh_ms = { type = "integer", default = d.refresh_ms, gt = 0 } },
    }
end

return {
    name = "rl",
    fields = {
        { protocols = typedefs.protocols_http },
        { config = {
            type = "record",
            fields = {
                -- a rule policy (JSON); when set, it is the whole configuration
                { policy = { type = "string", custom_validator = valid_policy } },
                { redis = { type = "record", fields = redis_fields({
                    host = "127.0.0.1", port = 6379, timeout_ms = 20, pool_size = 64,
                    keepalive_ms = 60000, mode = "single", master_name = "mymaster",
                    dict = "rl_redis", refresh_ms = 1000 }) } },
                { key_prefix = { type = "string", default = "rl" } },
                { shadow = { type = "boolean", default = false } },
                { legacy_headers = { type = "boolean", default = false } },
                { problem_base = { type = "string", default = "https://api.example.com/problems" } },
                { fail_closed_retry_after = { type = "integer", default = 15, gt = 0 } },
                { fallback_ratio = { type = "number", default = 0.25, between = { 0.01, 1 } } },
                { fallback_entries = { type = "integer", default = 10000, gt = 0 } },
                { metrics_dict = { type = "string", default = "rl_metrics" } },
                { http_date_after = { type = "integer", default = 3600, gt = 0 } },
                { deny_cache = { type = "record", fields = {
                    { dict = { type = "string", default = "rl_deny" } },
                    { poll = { type = "number", default = 1, gt = 0 } },
                    { manual_ttl = { type = "number", default = 60, gt = 0 } },
                    { recheck = { type = "number", default = 2, gt = 0 } },
                } } },
                { manual_box_status = { type = "integer", default = 403, one_of = { 403, 429 } } },
                { client_ip_header = { type = "string" } },
                { identity = { type = "record", fields = {
                    { header = { type = "string", default = "X-Api-Key" } },
                    { keys = { type = "map", keys = { type = "string" }, values = {
                        type = "record", fields = {
                            { tenant = { type = "string", required = true } },
                            { tier = { type = "string", required = true } },
                            { key_id = { type = "string", required = true } },
                        } } } },
                } } },
                { tiers = { type = "map", keys = { type = "string" }, values = tier } },
                { routes = { type = "array", elements = route } },
                { default_route = { type = "record", fields = {
                    { template = { type = "string", default = "other" } },
                    { cost = { type = "integer", default = 1, gt = 0 } },
                    { critical = { type = "boolean", default = false } },
                } } },
                -- the tier's rate rule settled after the response (gateway/REFERENCE.md,
                -- "Post-paid charging (settle)")
                { settle = { type = "record", fields = {
                    { from = { type = "string", one_of = { "header", "usage", "bytes" } } },
                    { header = { type = "string" } },
                    { hide = { type = "boolean" } },
                    { scale = { type = "number", gt = 0 } },
                    { max_body = { type = "integer", gt = 0 } },
                } } },
                -- the tenant's bucket spent from the node's allowance ("Local allowances");
                -- with home, leased from the home region's bucket ("A region's allowance")
                { allowance = { type = "record", custom_validator = valid_allowance, fields = {
                    { size = { type = "integer", gt = 0 } },
                    { max_age = { type = "number", gt = 0 } },
                    { refill_below = { type = "integer" } },
                    { dict = { type = "string" } },
                    -- the home region's Redis: the fields of redis, those unset taken from it
                    { home = { type = "record", fields = redis_fields() } },
                    -- points a node admits on its own while the home is unreachable
                    { borrow = { type = "integer", between = { 0, 1000000000 } } },
                } } },
                { auth = { type = "record", fields = {
                    { subject_arg = { type = "string", default = "client_id" } },
                    { fail_statuses = { type = "array", elements = { type = "integer" },
                                        default = { 401, 403 } } },
                    { subject = window(5) },
                    { ip = window(20) },
                    { box = durations() },
                    { attempt_ttl = { type = "number", default = 30, gt = 0 } },
                    { attempt_wait_ms = { type = "integer", default = 500, between = { 0, 60000 } } },
                    { busy_retry_after = { type = "integer", default = 1, gt = 0 } },
                } } },
            },
        } },
    },
}
