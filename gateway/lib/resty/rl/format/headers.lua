-- resty.rl.format.headers: the response fields of draft-ietf-httpapi-ratelimit-headers
-- (the current RateLimit-Policy / RateLimit structured fields, and the older
-- RateLimit-Limit / -Remaining / -Reset triple behind an option) and
-- Retry-After.

local _M = {}

local ceil = math.ceil

--- Whole seconds from milliseconds, rounded up (clients are never early).
function _M.seconds(ms)
    if not ms or ms <= 0 then
        return 0
    end
    return ceil(ms / 1000)
end

-- Quoted names seen before (policy names come from the configuration: a
-- few dozen; the cache starts over past MAX_QUOTED).
local quoted, n_quoted, MAX_QUOTED = {}, 0, 1000

-- A structured-field String item.
local function sf_string(s)
    local q = quoted[s]
    if q then
        return q
    end
    q = '"' .. s:gsub('[\\"]', "\\%0") .. '"'
    if n_quoted >= MAX_QUOTED then
        quoted, n_quoted = {}, 0
    end
    quoted[s], n_quoted = q, n_quoted + 1
    return q
end

--- One quota policy item: "name";q=quota[;qu="unit"][;w=window]: `qu`
--- when the unit is not requests (points, cents, concurrent-requests),
--- no `w` for a concurrency limit.
function _M.policy_item(p)
    local s = sf_string(p.name) .. ";q=" .. p.quota
    if p.unit and p.unit ~= "requests" then
        s = s .. ";qu=" .. sf_string(p.unit)
    end
    if p.window then
        s = s .. ";w=" .. p.window
    end
    return s
end

-- Sets the RateLimit field (and the legacy triple with legacy_headers)
-- of the policy `name`: `r` whole units left (not negative), `t` seconds
-- until the quota is back (nil: none to give, as in a box).
local function set_ratelimit(out, conf, name, limit, r, t)
    -- one string.format (no intermediate string; %d writes a number as an
    -- integer, which LuaJIT does faster than `..`, and a structured-field
    -- integer has neither exponent nor fraction)
    out["RateLimit"] = t and string.format("%s;r=%d;t=%d", sf_string(name), r, t)
        or string.format("%s;r=%d", sf_string(name), r)
    if conf.legacy_headers then
        out["RateLimit-Limit"] = tostring(limit)
        out["RateLimit-Remaining"] = tostring(r)
        out["RateLimit-Reset"] = t and tostring(t) or nil
    end
    return out
end

--- Sets the RateLimit field (and the legacy triple with legacy_headers)
--- for `b` = {name, limit, remaining, reset_ms, window, clamp, boxed}: `r`
--- whole units left, `t` seconds until the quota is back; with `clamp` (a
--- window or quota) at most the window `w` (a sliding window can take up to
--- two windows to count nothing); a bucket's `t` is its time to be full
--- again, which may exceed its refill period. No `t` for a box.
function _M.ratelimit_field(out, conf, b)
    -- a box has no reset within the window: Retry-After says when it ends
    local t = not b.boxed and b.reset_ms and _M.seconds(b.reset_ms)
    if t and b.clamp and b.window then
        t = math.min(t, math.ceil(b.window))
    end
    return set_ratelimit(out, conf, b.name, b.limit, math.max(b.remaining or 0, 0), t or nil)
end

--- The RateLimit-Policy field value: the policies that apply, each
--- {name, quota, window}.
function _M.policy(policies)
    local items = {}
    for i, p in ipairs(policies) do
        items[i] = _M.policy_item(p)
    end
    return table.concat(items, ", ")
end

--- The field that marks an answer decided without Redis (by the local
--- limiter, or let through, while Redis failed or was over its budget),
--- and its value (also the `degraded` member of such a refusal's body).
_M.DEGRADED = "X-RateLimit-Degraded"
_M.DEGRADED_VALUE = "fallback"

--- Marks `out` (a header table) as a degraded answer.
function _M.degraded(out)
    out[_M.DEGRADED] = _M.DEGRADED_VALUE
    return out
end

--- The Unix time (whole seconds, rounded up: never early) `ms`
--- milliseconds from now, on a freshly updated clock.
function _M.ends_at(ms)
    ngx.update_time()
    return ceil((ngx.now() * 1000 + ms) / 1000)
end

--- Sets Retry-After in `out`: delta-seconds, or an HTTP-date when
--- `as_date` (boxes configured to last http_date_after or more). Nothing
--- for a negative wait (a manual box has no time to come back).
function _M.retry_after(out, ms, as_date)
    if not ms or ms < 0 then
        return out
    end
    local secs = _M.seconds(ms)
    if as_date then
        out["Retry-After"] = ngx.http_time(_M.ends_at(ms))
    else
        out["Retry-After"] = tostring(secs)
    end
    return out
end

return _M
