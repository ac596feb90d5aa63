-- resty.rl.nginx: the nginx (OpenResty / ngx_lua) front end.
--
--   init_by_lua_block   { require("resty.rl.nginx").configure("api", require("policy")) }
--   access_by_lua_block { require("resty.rl.nginx").access("api") }
--   header_filter_by_lua_block { require("resty.rl.nginx").header_filter("api") }
--   body_filter_by_lua_block { require("resty.rl.nginx").body_filter("api") }
--   log_by_lua_block    { require("resty.rl.nginx").log("api") }
--   location = /metrics { content_by_lua_block { require("resty.rl.metrics").serve() } }
--
-- Gateways are configured in init_by_lua (before the workers fork), so a
-- configuration error stops nginx from starting.

local gateway = require "resty.rl.gateway"
local cjson = require "cjson.safe"

local _M = {}

local instances = {}

-- The arguments of a form or JSON body (read once per request).
local function body_args()
    local ctx = ngx.ctx
    if ctx.rl_body_args then
        return ctx.rl_body_args
    end
    local args = {}
    local ctype = ngx.var.content_type or ""
    if ctype:find("application/x-www-form-urlencoded", 1, true) then
        ngx.req.read_body()
        args = ngx.req.get_post_args(100) or {}
    elseif ctype:find("application/json", 1, true) then
        ngx.req.read_body()
        local decoded = cjson.decode(ngx.req.get_body_data() or "")
        if type(decoded) == "table" then
            args = decoded
        end
    end
    ctx.rl_body_args = args
    return args
end

-- The ngx.var names of request headers ("X-Api-Key" -> "http_x_api_key"),
-- made once per name (names come from the configuration).
local header_vars = {}

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
        -- nginx joins) repeated ones joined with commas: then the list
        local v = ngx.var[var]
        if v == nil or not v:find(",", 1, true) then
            return v
        end
        return ngx.req.get_headers(100)[name]
    end,
    method = function()
        return ngx.req.get_method()
    end,
    path = function()
        return ngx.var.uri
    end,
    query_arg = function(name)
        return ngx.req.get_uri_args(100)[name]
    end,
    body_arg = function(name)
        return body_args()[name]
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

--- access_by_lua handler.
function _M.access(name)
    return get(name):access(_M.adapter)
end

--- header_filter_by_lua handler.
function _M.header_filter(name)
    return get(name):header_filter(_M.adapter)
end

--- body_filter_by_lua handler (rule policies with post-paid rules read
--- the response's usage here; nothing for the others).
function _M.body_filter(name)
    local gw = get(name)
    if gw.body_filter then
        return gw:body_filter(_M.adapter)
    end
end

--- log_by_lua handler.
function _M.log(name)
    return get(name):log(_M.adapter)
end

--- content_by_lua handler of GET /_rl/usage (resty.rl.usage).
function _M.usage(name)
    return require("resty.rl.usage").serve(get(name), _M.adapter)
end

--- content_by_lua handler of GET /_rl/dashboard (resty.rl.usage).
function _M.dashboard(name)
    return require("resty.rl.usage").dashboard(get(name), _M.adapter)
end

return _M
