-- resty.rl.policy: from a request to what the policy says about it: the
-- route, the caller's identity and tier, the cost, and the Redis keys.
--
-- Keys carry one hash tag per tenant ({t:<tenant>}) so that a call naming
-- the API key's bucket and the tenant's bucket stays in one slot.

local _M = {}

local md5 = ngx.md5

--- A value fit for a Redis key: kept when short and plain, else its MD5
--- (values from requests, such as a ledger id, never shape the key).
function _M.key_part(v)
    v = tostring(v)
    if #v <= 64 and v:match("^[%w%.@_:%-]+$") then
        return v
    end
    return md5(v)
end

--- A request argument as one string, or nil: the first of repeated
--- values; a number as text; a bare flag (`?x`, true) or anything else
--- as nil.
function _M.arg(req, name)
    local v = req.arg(name)
    if type(v) == "table" then
        v = v[1]
    end
    if type(v) == "number" then
        return tostring(v)
    end
    if type(v) ~= "string" then
        return nil
    end
    return v
end

--- The route of a request: the first configured route whose method and
--- template match, else the default route.
function _M.match_route(conf, method, path)
    for _, r in ipairs(conf.routes) do
        if (r.method == nil or r.method == method) and path:match(r.pattern) then
            return r
        end
    end
    return conf.default_route
end

--- The caller's identity {tenant, tier, key_id} from the API key header,
--- or nil when the key is missing or unknown.
function _M.identify(conf, req)
    local key = req.header(conf.identity.header)
    if type(key) == "table" then
        key = key[1]
    end
    if not key or key == "" then
        return nil
    end
    return conf.identity.keys[key]
end

-- Days from 1970-01-01 of a YYYY-MM-DD date, or nil.
local function day_number(s)
    if type(s) ~= "string" then
        return nil
    end
    local y, m, d = s:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)$")
    if not y then
        return nil
    end
    y, m, d = tonumber(y), tonumber(m), tonumber(d)
    if m < 1 or m > 12 or d < 1 or d > 31 then
        return nil
    end
    -- days from civil (proleptic Gregorian), H. Hinnant's algorithm
    if m <= 2 then
        y = y - 1
    end
    local era = math.floor(y / 400)
    local yoe = y - era * 400
    local mp = (m + 9) % 12
    local doy = math.floor((153 * mp + 2) / 5) + d - 1
    local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    return era * 146097 + doe - 719468
end
_M.day_number = day_number

--- The cost of a request on `route`: the route's cost, or the range cost
--- when its date range (from/to arguments) spans more than max_days. A
--- missing or unreadable `from` counts as an unbounded range; a missing
--- `to` means today.
function _M.cost(route, req)
    local r = route.range
    if not r then
        return route.cost
    end
    local from = day_number(_M.arg(req, r.from_arg))
    local to_arg = _M.arg(req, r.to_arg)
    local to = to_arg and day_number(to_arg) or math.floor(ngx.time() / 86400)
    if not from or not to or to - from > r.max_days then
        return r.cost
    end
    return route.cost
end

--- The Redis keys of a caller: its API key's bucket and its tenant's.
function _M.bucket_keys(conf, ident)
    local tag = conf.key_prefix .. ":{t:" .. _M.key_part(ident.tenant) .. "}"
    return tag .. ":key:" .. _M.key_part(ident.key_id), tag .. ":tenant"
end

--- The Redis key of a lease of `spec` (scope tenant or arg) for a caller.
function _M.lease_key(conf, ident, spec, req)
    local tag = conf.key_prefix .. ":{t:" .. _M.key_part(ident.tenant) .. "}"
    if spec.scope == "arg" then
        local v = _M.arg(req, spec.arg)
        -- no id: one shared lock for the requests that name none
        return tag .. ":lease:" .. spec.name .. ":" .. _M.key_part(v or "-")
    end
    return tag .. ":lease:" .. spec.name
end

--- The maximum of a lease for a tier.
function _M.lease_max(spec, tier)
    return spec.max or tier.concurrency[spec.name]
end

--- The Redis keys of a token request: per subject and per client IP.
function _M.auth_keys(conf, subject, ip)
    return conf.key_prefix .. ":{auth:sub:" .. _M.key_part(subject or "-") .. "}",
        conf.key_prefix .. ":{auth:ip:" .. _M.key_part(ip or "-") .. "}"
end

return _M
