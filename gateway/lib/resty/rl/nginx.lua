-- resty.rl.nginx: the nginx (OpenResty / ngx_lua) front end.
--
--   init_by_lua_block   { require("resty.rl.nginx").configure("api", require("policy")) }
--   access_by_lua_block { require("resty.rl.nginx").access("api") }
--   header_filter_by_lua_block { require("resty.rl.nginx").header_filter("api") }
--   body_filter_by_lua_block { require("resty.rl.nginx").body_filter("api") }
--   log_by_lua_block    { require("resty.rl.nginx").log("api") }
--   location = /metrics { content_by_lua_block { require("resty.rl.observe.metrics").serve() } }
--
-- Gateways are configured in init_by_lua (before the workers fork), so a
-- configuration error stops nginx from starting.

local gateway = require "resty.rl.gateway"
local usage = require "resty.rl.report.usage"
local cjson = require "cjson.safe"
local ffi = require "ffi"
local ngx_base = require "resty.core.base"
-- (declares the C functions of ngx.req.get_headers used below)
require "resty.core.request"

local _M = {}

local instances = {}

--- The largest request body whose arguments the gateway reads, in bytes
--- (1 MiB, nginx's default client_max_body_size): wherever nginx keeps
--- the body, in memory or (above client_body_buffer_size) in its temp
--- file. A larger body has no argument the gateway can read: a rule that
--- needs one refuses the request (413), never skips it.
_M.MAX_BODY_ARGS = 1048576

-- The request body as a string ("" for none), or nil, "too_large".
local function body_data()
    ngx.req.read_body()
    local data = ngx.req.get_body_data()
    if data then
        return data
    end
    local path = ngx.req.get_body_file()
    if not path then
        return ""
    end
    local f = io.open(path, "rb")
    if not f then
        return nil, "too_large"
    end
    local size = f:seek("end")
    if size and size <= _M.MAX_BODY_ARGS then
        f:seek("set")
        data = f:read("*a")
    end
    f:close()
    if not data then
        return nil, "too_large"
    end
    return data
end

-- Whether the request has a body (a length above 0, or chunked).
local function has_body()
    local len = tonumber(ngx.var.http_content_length)
    return (len and len > 0) or ngx.var.http_transfer_encoding ~= nil
end

-- The arguments of a form or JSON body (read once per request), or an
-- empty table and "too_large" (see MAX_BODY_ARGS), "invalid" (a JSON
-- body that does not decode) or "unsupported" (a body of another media
-- type, multipart included: its arguments cannot be known). Media types
-- compare case-insensitively; JSON is application/json or any
-- application/...+json.
local function body_args()
    local ctx = ngx.ctx
    if ctx.rl_body_args then
        return ctx.rl_body_args, ctx.rl_body_error
    end
    local args, err = {}, nil
    local ctype = (ngx.var.content_type or ""):lower()
    local form = ctype:find("application/x-www-form-urlencoded", 1, true)
    local json = not form and (ctype:find("application/json", 1, true)
        or ctype:find("^%s*application/[%w%.%-]+%+json"))
    if not form and not json then
        if has_body() then
            err = "unsupported"
        end
    else
        local data
        data, err = body_data()
        if data and form then
            -- every argument (the body is bounded): one beyond a count
            -- would reach the upstream unseen
            args = ngx.decode_args(data, 0) or {}
        elseif data then
            local decoded = cjson.decode(data)
            if type(decoded) == "table" then
                args = decoded
            elseif decoded == nil and data:find("%S") then
                -- not JSON to this decoder (nested deeper than it reads,
                -- ...): its arguments cannot be known
                err = "invalid"
            end
        end
    end
    ctx.rl_body_args, ctx.rl_body_error = args, err
    return args, err
end

-- The ngx.var names of request headers ("X-Api-Key" -> "http_x_api_key"),
-- made once per name (names come from the configuration).
local header_vars = {}
-- The names of request headers as ngx.req.get_headers gives them
-- ("X-Api-Key" -> "x-api-key").
local header_keys = {}

-- The request's headers as ngx.req.get_headers(0) reads them (every
-- one, names in lower case), through the same C functions of ngx_lua,
-- but without its table: one string made per value of the header
-- looked for, none for the other headers (get_headers makes a table and
-- two strings per header: 1,000-1,500 instructions a request more in
-- bench/gateway_instructions.sh).
local C, ffi_str, ffi_cast = ffi.C, ffi.string, ffi.cast
local get_request, get_string_buf = ngx_base.get_request, ngx_base.get_string_buf
local elt_ptr = ffi.typeof("ngx_http_lua_ffi_table_elt_t*")
local elt_size = ffi.sizeof("ngx_http_lua_ffi_table_elt_t")
local truncated = ffi.new("int[1]")

-- Whether ngx_lua's C functions have the signature used here (the count
-- with its `truncated` argument: resty.core 0.1.24 and later, OpenResty
-- 1.21.4+, Debian 12), by resty.core's version (LuaJIT's name of a C
-- function's type leaves its parameters out); elsewhere
-- ngx.req.get_headers(0) gives the same values.
local ffi_headers
do
    local major, minor, patch = tostring(ngx_base.version):match("^(%d+)%.(%d+)%.(%d+)")
    major, minor, patch = tonumber(major), tonumber(minor), tonumber(patch)
    ffi_headers = major ~= nil and (major > 0 or minor > 1 or minor == 1 and patch >= 24)
    if not ffi_headers then
        -- said once, when the module loads: the same values, at a cost
        ngx.log(ngx.WARN, "rl: resty.core ", tostring(ngx_base.version), " is older than",
            " 0.1.24: request headers are read through ngx.req.get_headers (slower)")
    end
end

-- The values of request header `key` (lower case): a string, a list for
-- a repeated one, or nil. Every header counts, however many the request
-- has (a header past a count could not be seen).
local function header_of(key)
    if not ffi_headers then
        return ngx.req.get_headers(0)[key]
    end
    local r = get_request()
    if not r then
        error("no request found")
    end
    local n = C.ngx_http_lua_ffi_req_get_headers_count(r, 0, truncated)
    if n == ngx_base.FFI_BAD_CONTEXT then
        error("API disabled in the current context", 2)
    end
    if n <= 0 then
        return nil
    end
    local buf = ffi_cast(elt_ptr, get_string_buf(n * elt_size))
    if C.ngx_http_lua_ffi_req_get_headers(r, buf, n, 0) ~= 0 then
        return nil
    end
    local len, found = #key, nil
    for i = 0, n - 1 do
        local k = buf[i].key
        if k.len == len and ffi_str(k.data, len) == key then
            local v = buf[i].value
            v = ffi_str(v.data, v.len)
            if found == nil then
                found = v
            elseif type(found) == "table" then
                found[#found + 1] = v
            else
                found = { found, v }
            end
        end
    end
    return found
end

-- Every value of request header `name`: a string, a list for a repeated
-- one, or nil; by the name get_headers' table has (lower case, "-" for
-- "_"), made once per name.
local function header_values(name)
    local key = header_keys[name]
    if not key then
        key = name:lower():gsub("_", "-")
        header_keys[name] = key
    end
    return header_of(key)
end

--- The request adapter of resty.rl.gateway for ngx_lua.
_M.adapter = {
    -- a request header: a string, or a list for a repeated one
    header = function(name)
        local var = header_vars[name]
        if not var then
            var = "http_" .. name:lower():gsub("-", "_")
            header_vars[name] = var
        end
        -- $http_<name> is the one header, or (nginx 1.23+, or a header
        -- nginx joins) repeated ones joined with commas: then the list, of
        -- every header (a client's padding must not push a proxy's line
        -- out of sight)
        local v = ngx.var[var]
        if v == nil or not v:find(",", 1, true) then
            return v
        end
        return header_values(name)
    end,
    -- every value of a request header: a string, a list for a repeated
    -- one (whatever nginx's version), or nil
    header_values = header_values,
    method = function()
        return ngx.req.get_method()
    end,
    path = function()
        return ngx.var.uri
    end,
    query_arg = function(name)
        -- every argument (nginx bounds the request line): one beyond a
        -- count would reach the upstream unseen
        return ngx.req.get_uri_args(0)[name]
    end,
    -- nil, "too_large" for a body too large to read (MAX_BODY_ARGS), nil,
    -- "invalid" for a JSON body that does not decode
    body_arg = function(name)
        local args, err = body_args()
        if err then
            return nil, err
        end
        return args[name]
    end,
    client_ip = function()
        return ngx.var.remote_addr
    end,
    request_id = function()
        return ngx.var.request_id
    end,
    ctx = function()
        return ngx.ctx
    end,
    exit = function(status, body, headers)
        ngx.status = status
        for k, v in pairs(headers) do
            ngx.header[k] = v
        end
        ngx.print(body)
        return ngx.exit(status)
    end,
    set_header = function(name, value)
        ngx.header[name] = value
    end,
    -- a request header for the upstream (nil: removed)
    set_upstream_header = function(name, value)
        ngx.req.set_header(name, value)
    end,
    -- bytes of the response body sent (log phase): egress quotas
    bytes_sent = function()
        return tonumber(ngx.var.body_bytes_sent)
    end,
    status = function()
        return ngx.status
    end,
    warn = function(msg)
        ngx.log(ngx.WARN, msg)
    end,
}

--- Creates the gateway `name` from configuration `conf` (init_by_lua).
function _M.configure(name, conf)
    instances[name] = gateway.new(conf)
    return instances[name]
end

local function get(name)
    local gw = instances[name or "default"]
    if not gw then
        error("rl: no gateway configured under the name " .. tostring(name))
    end
    return gw
end

-- The phase handlers, `_M.<phase>(name)`: the gateway `name`'s phase of
-- the same name. One function each, not closures of one function over
-- the phase's name: LuaJIT starts a trace at a hot function, and one
-- function for every phase would have one root trace, which the other
-- phases leave at once, through its exits, for traces of their own.

--- access_by_lua: the decision (may end the request).
function _M.access(name)
    return get(name):access(_M.adapter)
end

--- header_filter_by_lua: the RateLimit fields.
function _M.header_filter(name)
    return get(name):header_filter(_M.adapter)
end

--- body_filter_by_lua: post-paid rules read the response's usage
--- (nothing for the others).
function _M.body_filter(name)
    return get(name):body_filter(_M.adapter)
end

--- log_by_lua: counters, the log line, lease release.
function _M.log(name)
    return get(name):log(_M.adapter)
end

--- content_by_lua handler of GET /_rl/usage (resty.rl.report.usage).
function _M.usage(name)
    return usage.serve(get(name), _M.adapter)
end

--- content_by_lua handler of GET /_rl/dashboard (resty.rl.report.usage).
function _M.dashboard(name)
    return usage.dashboard(get(name), _M.adapter)
end

return _M
