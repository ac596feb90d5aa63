-- resty.rl.problem: application/problem+json bodies (RFC 9457) for the
-- gateway's refusals. Bodies carry only the caller's own data: its tier,
-- its budget, the cost and the wait; never a Redis key, a Redis detail or
-- another tenant's data.

local cjson = require "cjson.safe"

local _M = {}

_M.CONTENT_TYPE = "application/problem+json"

local TITLES = {
    ["rate-limit-exceeded"] = "Rate limit exceeded",
    ["penalty-box-active"] = "Penalty box active",
    ["concurrency-limit-exceeded"] = "Concurrency limit exceeded",
    ["rate-limiter-unavailable"] = "Rate limiter unavailable",
    ["unauthenticated"] = "Unknown or missing API key",
    ["ambiguous-argument"] = "Ambiguous request argument",
}

--- The ISO 8601 / RFC 3339 UTC form of a Unix time.
function _M.timestamp(t)
    return os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(t))
end

--- A backoff recommendation for a wait of `secs` seconds.
function _M.backoff(secs)
    if not secs then
        return { strategy = "none", detail = "manual review: do not retry" }
    end
    return {
        strategy = "exponential",
        initial_seconds = math.max(secs, 1),
        max_seconds = math.max(secs, 60),
        jitter = "full",
    }
end

--- Encodes a problem of `kind` (a key of TITLES) with `status` and the
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
