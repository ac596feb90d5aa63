-- resty.rl.request.fields: what a request says that the policy reads: its
-- arguments (query string and body, which must agree), headers and
-- credential, the login subject, its route and its cost, and the form of
-- a value in a Redis key.

local memo = require "resty.rl.base.memo"

local _M = {}

local md5 = ngx.md5
local format, floor = string.format, math.floor

--- A number as text, exactly: an integer in its digits (-0 as 0), any
--- other number in the fewest significant digits (14 to 17) that read
--- back as it (tostring keeps 14 whatever the number, so 123456789012345
--- and 123456789012346 would read the same, and two callers would share
--- a key).
function _M.number_text(n)
    if n == floor(n) and n > -2 ^ 53 and n < 2 ^ 53 then
        return format("%d", n)
    end
    for digits = 14, 16 do
        local s = format("%." .. digits .. "g", n)
        if tonumber(s) == n then
            return s
        end
    end
    return format("%.17g", n)
end

--- A value fit for a Redis key: kept when short and plain, else its MD5
--- (values from requests, such as a ledger id, never shape the key).
function _M.key_part(v)
    v = type(v) == "number" and _M.number_text(v) or tostring(v)
    if #v <= 64 and v:match("^[%w%.@_:%-]+$") then
        return v
    end
    return md5(v)
end

-- Adds the string forms of `v` (a string, a number, or a list of them,
-- as repeated arguments come) to the set `out`; anything else (a bare
-- flag, a JSON object or boolean) adds nothing.
local function add_values(v, out)
    if type(v) == "table" then
        for _, x in ipairs(v) do
            add_values(x, out)
        end
    elseif type(v) == "number" then
        out[_M.number_text(v)] = true
    elseif type(v) == "string" then
        out[v] = true
    end
end

-- The one value of a set of values, nil for none, or nil and "ambiguous"
-- for two different values.
local function single(set)
    local one = next(set)
    if one ~= nil and next(set, one) ~= nil then
        return nil, "ambiguous"
    end
    return one
end

--- A request argument as one string: the value the query string and the
--- (form or JSON) body agree on, whichever carries it. Returns nil when no
--- source has it, and nil, "ambiguous" when the sources (or repeated
--- values) disagree: the gateway must not key a limit on one value while
--- the upstream acts on another; nil, "too_large" when the body is too
--- large for the gateway to read (the front end's limit), nil, "invalid"
--- when it does not decode, nil, "unsupported" when the query string does
--- not have it and the body is of a media type the gateway does not read
--- (multipart, ...): a rule must not be skipped for want of an argument
--- the upstream may well read.
function _M.arg(req, name)
    local set = {}
    add_values(req.query_arg(name), set)
    local body, err = req.body_arg(name)
    if err == "unsupported" and next(set) ~= nil then
        err = nil
    end
    if err then
        return nil, err
    end
    add_values(body, set)
    return single(set)
end

--- The user part of an `Authorization: Basic` header (RFC 7617; for OAuth
--- client_secret_basic the client id, form-urlencoded), or nil.
function _M.basic_user(req)
    local h = _M.header(req, "Authorization")
    if not h then
        return nil
    end
    local b64 = h:match("^%s*[Bb][Aa][Ss][Ii][Cc]%s+(%S+)%s*$")
    local creds = b64 and ngx.decode_base64(b64)
    local user = creds and creds:match("^([^:]*):")
    if not user or user == "" then
        return nil
    end
    return ngx.unescape_uri(user)
end

--- The subject of a token request: the Basic user and the body's
--- `subject_arg`, which must agree when both are sent; the query string is
--- never a source (RFC 6749 keeps credentials out of the URI), and a query
--- value that differs from the subject makes the request ambiguous.
--- Returns the subject or nil (none sent), or nil, "ambiguous" (or
--- "too_large": a body the gateway cannot read).
function _M.auth_subject(req, subject_arg)
    local set = {}
    local body, err = req.body_arg(subject_arg)
    local user = _M.basic_user(req)
    if err == "unsupported" and user then
        err = nil
    end
    if err then
        return nil, err
    end
    add_values(body, set)
    add_values(user, set)
    local subject, err = single(set)
    if err then
        return nil, err
    end
    local query = {}
    add_values(req.query_arg(subject_arg), query)
    for v in pairs(query) do
        if v ~= subject then
            return nil, "ambiguous"
        end
    end
    return subject
end

-- The first value of a header (a string, or a list for a repeated one),
-- nil when it is empty.
local function first_value(v)
    if type(v) == "table" then
        v = v[1]
    end
    if type(v) ~= "string" or v == "" then
        return nil
    end
    return v
end

--- A request header as one string (the first of repeated ones), or nil.
function _M.header(req, name)
    return first_value(req.header(name))
end

--- The credential (an API key) in request header `name`, or nil; nil,
--- "ambiguous" when the header comes more than once: the gateway must not
--- charge one key while the upstream may read another.
function _M.credential(req, name)
    local v = req.header_values(name)
    if type(v) == "table" and #v > 1 then
        return nil, "ambiguous"
    end
    return first_value(v)
end

-- The first configured route whose method and template match, else the
-- default route (the match itself; see match_route).
local function first_route(method, path, conf)
    -- HEAD does the work of GET (the upstream builds the same response and
    -- drops the body): it matches GET routes, cost and leases included
    local alt = method == "HEAD" and "GET" or method
    for _, r in ipairs(conf.routes) do
        if (r.method == nil or r.method == method or r.method == alt)
            and path:match(r.pattern) then
            return r
        end
    end
    return conf.default_route
end

-- Per configuration, the routes of the methods and paths seen (a memo of
-- at most ROUTES_SEEN; paths with ids are many, the memo then starts
-- over): a path seen before is matched without the route loop, which
-- would keep LuaJIT from compiling the access phase.
local ROUTES_SEEN = 1000
local route_memos = setmetatable({}, { __mode = "k" })

--- The route of a request: the first configured route whose method and
--- template match, else the default route.
function _M.match_route(conf, method, path)
    local m = route_memos[conf]
    if not m then
        m = memo.new(ROUTES_SEEN)
        route_memos[conf] = m
    end
    return m:peek(method, path) or m:get(method, path, first_route, conf)
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
--- `to` means today; an ambiguous `from` or `to` (repeated, or different
--- in the query and the body) costs the range cost, and so does a range
--- that ends before it starts (an upstream may read it either way round).
function _M.cost(route, req)
    local r = route.range
    if not r then
        return route.cost
    end
    local from = day_number(_M.arg(req, r.from_arg))
    local to_arg, to_err = _M.arg(req, r.to_arg)
    local to = to_arg and day_number(to_arg) or math.floor(ngx.time() / 86400)
    if not from or not to or to_err or to < from or to - from > r.max_days then
        return r.cost
    end
    return route.cost
end

return _M
