-- kong_shim: a minimal stand-in for the Kong PDK, FOR TESTS ONLY.
--
-- Kong cannot be installed on the test machines, so the test nginx runs the
-- Kong plugin's handler (kong/plugins/rl/handler.lua) through this shim:
-- the PDK functions the handler uses, each checking the nginx phase it is
-- called in as Kong does, kong.ctx.plugin per request, and the plugin
-- configuration built from schema.lua's defaults the way Kong fills them
-- (unset options without a default become ngx.null).
--
--   init_by_lua_block   { require("kong_shim").install(); conf = ... }
--   access_by_lua_block { require("kong_shim").run("access") }

local cjson = require "cjson.safe"
local mapped = require("resty.rl.base.tables").mapped

local _M = {}

-- The phases in which a PDK function may be called (from the PDK docs).
local REQ = { rewrite = true, access = true, header_filter = true, body_filter = true,
              log = true, content = true }
local EXIT = { rewrite = true, access = true, content = true }
local SET_HEADER = { rewrite = true, access = true, header_filter = true, content = true }
local GET_STATUS = { header_filter = true, body_filter = true, log = true }
local GET_BODY = { rewrite = true, access = true, content = true }

local function phase_check(name, allowed)
    local phase = ngx.get_phase()
    if not allowed[phase] then
        error(name .. " called in phase " .. phase .. ", which Kong does not allow", 3)
    end
end

-- The functions of the PDK table `prefix` ("kong.request") from `defs`,
-- name = { phases allowed, function }: each checks its phase first.
local function pdk(prefix, defs)
    local out = {}
    for name, def in pairs(defs) do
        local full, allowed, fn = prefix .. "." .. name, def[1], def[2]
        out[name] = function(...)
            phase_check(full, allowed)
            return fn(...)
        end
    end
    return out
end

local function first(v)
    if type(v) == "table" then
        return v[1]
    end
    return v
end

local function plugin_ctx()
    local c = ngx.ctx.kong_plugin_ctx
    if not c then
        c = {}
        ngx.ctx.kong_plugin_ctx = c
    end
    return c
end

-- kong.request.get_body
local function get_body()
    local ctype = ngx.var.content_type or ""
    ngx.req.read_body()
    if not ngx.req.get_body_data() and ngx.req.get_body_file() then
        -- Kong's answer for a body nginx keeps in a temp file
        return nil, "request body did not fit into client body buffer, consider "
            .. "raising 'client_body_buffer_size'"
    end
    if ctype:find("application/x-www-form-urlencoded", 1, true) then
        return ngx.req.get_post_args(100), nil, "application/x-www-form-urlencoded"
    elseif ctype:find("application/json", 1, true) then
        return cjson.decode(ngx.req.get_body_data() or ""), nil, "application/json"
    end
    return nil, "missing content type", ctype
end

-- kong.response.exit
local function exit(status, body, headers)
    ngx.status = status
    for k, v in pairs(headers or {}) do
        ngx.header[k] = v
    end
    if body then
        ngx.print(body)
    end
    return ngx.exit(status)
end

--- The `kong` global of the shim.
_M.kong = {
    request = pdk("kong.request", {
        get_header = { REQ, function(name) return first(ngx.req.get_headers(100)[name]) end },
        get_headers = { REQ, function(max) return ngx.req.get_headers(max or 100) end },
        get_method = { REQ, function() return ngx.req.get_method() end },
        get_path = { REQ, function() return ngx.var.uri end },
        get_query_arg = { REQ, function(name) return first(ngx.req.get_uri_args(100)[name]) end },
        get_query = { REQ, function(max) return ngx.req.get_uri_args(max or 100) end },
        get_body = { GET_BODY, get_body },
    }),
    client = pdk("kong.client", {
        get_forwarded_ip = { REQ, function() return ngx.var.remote_addr end },
    }),
    response = pdk("kong.response", {
        exit = { EXIT, exit },
        set_header = { SET_HEADER, function(name, value) ngx.header[name] = value end },
        get_status = { GET_STATUS, function() return ngx.status end },
    }),
    service = {
        request = pdk("kong.service.request", {
            set_header = { EXIT, function(name, value) ngx.req.set_header(name, value) end },
            clear_header = { EXIT, function(name) ngx.req.clear_header(name) end },
        }),
    },
    log = {
        warn = function(...)
            ngx.log(ngx.WARN, "[kong] ", ...)
        end,
        err = function(...)
            ngx.log(ngx.ERR, "[kong] ", ...)
        end,
    },
    ctx = setmetatable({}, {
        __index = function(_, k)
            if k == "plugin" then
                return plugin_ctx()
            end
        end,
    }),
}

-- kong.db.schema.typedefs, as far as schema.lua uses it: callable field
-- definitions.
local function typedef(def)
    return setmetatable(def, {
        __call = function(self, over)
            local out = {}
            for k, v in pairs(self) do
                out[k] = v
            end
            for k, v in pairs(over or {}) do
                out[k] = v
            end
            return out
        end,
    })
end

local typedefs = {
    protocols_http = typedef({ type = "set", elements = { type = "string" },
                               default = { "http", "https" } }),
    http_method = typedef({ type = "string", match = "^%u+$" }),
    host = typedef({ type = "string" }),
    port = typedef({ type = "integer", between = { 0, 65535 } }),
}

-- The value Kong stores for a field: the user's, else the default, else
-- ngx.null; records are filled recursively (also inside arrays and maps).
local function fill(field, value)
    if value == nil then
        value = field.default
    end
    if value == nil and field.type ~= "record" then
        return ngx.null
    end
    -- Kong runs a field's custom validator on the value it stores
    if field.custom_validator then
        local ok, err = field.custom_validator(value)
        if not ok then
            error("schema violation: " .. tostring(err), 0)
        end
    end
    if field.type == "record" then
        value = value or {}
        local out = {}
        for _, f in ipairs(field.fields) do
            local name, def = next(f)
            out[name] = fill(def, value[name])
        end
        return out
    end
    -- records inside an array (its elements) or a map (its values)
    local inner = field.type == "array" and field.elements or field.type == "map" and field.values
    if inner and inner.type == "record" then
        return mapped(value, function(v) return fill(inner, v) end)
    end
    return value
end

--- Installs the shim: the `kong` global and kong.db.schema.typedefs.
function _M.install()
    package.loaded["kong.db.schema.typedefs"] = typedefs
    rawset(_G, "kong", _M.kong)
end

--- The plugin configuration Kong would hand the handler for `user`
--- (a partial `config`), built from the plugin's schema.lua.
function _M.plugin_conf(user)
    local schema = require "kong.plugins.rl.schema"
    for _, f in ipairs(schema.fields) do
        local name, def = next(f)
        if name == "config" then
            return fill(def, user)
        end
    end
    error("schema.lua has no config field")
end

local conf

--- Sets the configuration of the plugin instance (init_by_lua).
function _M.configure(user)
    conf = _M.plugin_conf(user)
    return conf
end

--- Runs the handler's `phase` (access, header_filter or log) with the
--- configured plugin configuration.
function _M.run(phase)
    local handler = require "kong.plugins.rl.handler"
    return handler[phase](handler, conf)
end

return _M
