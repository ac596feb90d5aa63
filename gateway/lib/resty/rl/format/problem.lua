-- resty.rl.format.problem: application/problem+json bodies (RFC 9457) for the
-- gateway's refusals. Bodies carry only the caller's own data: its tier,
-- its budget, the cost and the wait; never a Redis key, a Redis detail or
-- another tenant's data.

local cjson = require "cjson.safe"
local mapped = require("resty.rl.base.tables").mapped

local _M = {}

_M.CONTENT_TYPE = "application/problem+json"

--- The backoff problem bodies recommend (the ledger design's wording).
_M.RECOMMENDED_BACKOFF = "exponential_with_full_jitter"

-- The problem types: their title and the machine-readable `$error` of a
-- refusal of that type.
local TYPES = {
    ["rate-limit-exceeded"] = { "Rate limit exceeded", "RATE_LIMIT_EXCEEDED" },
    ["penalty-box-active"] = { "Penalty box active", "RATE_LIMIT_EXCEEDED" },
    ["concurrency-limit-exceeded"] = { "Concurrency limit exceeded", "CONCURRENCY_LIMIT_EXCEEDED" },
    ["rate-limiter-unavailable"] = { "Rate limiter unavailable", "RATE_LIMITER_UNAVAILABLE" },
    ["unauthenticated"] = { "Unknown or missing API key", "UNAUTHENTICATED" },
    ["ambiguous-argument"] = { "Ambiguous request argument", "INVALID_ARGUMENT" },
    ["body-too-large"] = { "Request body too large to check", "PAYLOAD_TOO_LARGE" },
    ["body-unsupported"] = { "Request body of a type the gateway cannot read",
        "UNSUPPORTED_MEDIA_TYPE" },
    ["quota-exceeded"] = { "Quota exceeded", "QUOTA_EXCEEDED" },
    ["challenge-required"] = { "Re-authentication required", "REAUTH_REQUIRED" },
}

-- Titles and `$error`s by problem type (looked up per refusal).
local TITLES, ERRORS = {}, {}
for kind, t in pairs(TYPES) do
    TITLES[kind], ERRORS[kind] = t[1], t[2]
end

-- Replaces "$name" strings inside a template (recursively) by vars[name]
-- (typed: a number stays a number, a missing value is null).
local function fill(template, vars)
    if type(template) == "table" then
        return mapped(template, fill, vars)
    end
    if type(template) == "string" then
        local name = template:match("^%$([%w_]+)$")
        if name then
            local v = vars[name]
            if v == nil then
                return ngx.null
            end
            return v
        end
        return (template:gsub("%$([%w_]+)", function(n)
            local v = vars[n]
            return (v == nil or v == ngx.null) and "" or tostring(v)
        end))
    end
    return template
end

--- The body of a rule policy's refusal: (content type, body). `vars`:
--- status, type, message, retry_after, policy, tier, strikes, level,
--- ends_at, block_type, upgrade_url, challenge, concurrency_limit,
--- instance, request_id, error, degraded ("fallback": decided without
--- Redis); `fields` a rule's own extra members.
--- Format "problem" (default): application/problem+json with the ledger
--- design's members; format "json": conf.body.template filled with vars.
function _M.render(conf, vars, boxed, fields)
    local body
    if vars.error == nil or vars.error == ngx.null then
        vars.error = ERRORS[vars.type] or "RATE_LIMIT_EXCEEDED"
    end
    if conf.body.format == "json" then
        body = fill(conf.body.template, vars)
        for k, v in pairs(fields or {}) do
            body[k] = fill(v, vars)
        end
        local json = cjson.encode(body) or "{}"
        return "application/json", (json:gsub("\\/", "/"))
    end
    body = {
        type = conf.problem_base .. "/" .. vars.type,
        title = TITLES[vars.type] or vars.type,
        status = vars.status,
        detail = vars.message,
        instance = vars.instance,
        request_id = vars.request_id,
    }
    if vars.status == 429 or vars.status == 403 or vars.status == 409 or vars.status == 401
        and vars.type == "challenge-required" or vars.status == 503 then
        body.retry_after_seconds = vars.retry_after
        body.recommended_backoff = (vars.retry_after == nil or vars.retry_after == ngx.null)
            and "none" or _M.RECOMMENDED_BACKOFF
        body.quota_tier = vars.tier
        body.policy = vars.policy
    end
    if vars.strikes ~= nil and vars.strikes ~= ngx.null then
        body.penalty_strikes_remaining = vars.strikes
    end
    if boxed then
        body.penalty_level = vars.level
        body.lockout_ends_at = vars.ends_at
    end
    for _, k in ipairs({ "block_type", "upgrade_url", "challenge", "concurrency_limit", "degraded" }) do
        if vars[k] ~= nil and vars[k] ~= ngx.null then
            body[k] = vars[k]
        end
    end
    for k, v in pairs(fields or {}) do
        body[k] = fill(v, vars)
    end
    local json = cjson.encode(body) or "{}"
    return _M.CONTENT_TYPE, (json:gsub("\\/", "/"))
end

--- The ISO 8601 / RFC 3339 UTC form of a Unix time.
function _M.timestamp(t)
    return os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(t))
end

--- The backoff a client should use after a wait of `secs` seconds: the
--- ledger design's "exponential_with_full_jitter", or "none" (a manual
--- box: do not retry).
function _M.backoff(secs)
    if not secs then
        return "none"
    end
    return _M.RECOMMENDED_BACKOFF
end

--- Encodes a problem of `kind` (a key of TYPES) with `status` and the
--- extension members of `fields` (nil members are left out).
function _M.encode(conf, kind, status, fields)
    local body = {
        type = conf.problem_base .. "/" .. kind,
        title = TITLES[kind] or kind,
        status = status,
    }
    for k, v in pairs(fields) do
        body[k] = v
    end
    local json = cjson.encode(body) or "{}"
    -- lua-cjson escapes "/" as "\/": valid JSON, but not what people read
    return (json:gsub("\\/", "/"))
end

--- The `detail` sentence of a rate-limit refusal.
function _M.rate_detail(tier_name, budget, cost, wait_s)
    return string.format(
        "Tier %s: %s budget of %d points per %d s (burst %d); this request costs %d %s; "
        .. "the budget refills at %.3g points per second; retry in %d s.",
        tier_name, budget.scope, budget.rate, budget.period, budget.burst, cost,
        cost == 1 and "point" or "points", budget.rate / budget.period, wait_s)
end

return _M
