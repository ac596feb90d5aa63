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

--- The `kong` global of the shim.
_M.kong = {
    request = {
        get_header = function(name)
            phase_check("kong.request.get_header", REQ)
            return first(ngx.req.get_headers(100)[name])
        end,
        get_headers = function(max_headers)
            phase_check("kong.request.get_headers", REQ)
            return ngx.req.get_headers(max_headers or 100)
        end,
        get_method = function()
            phase_check("kong.request.get_method", REQ)
            return ngx.req.get_method()
        end,
        get_path = function()
            phase_check("kong.request.get_path", REQ)
            return ngx.var.uri
        end,
        get_query_arg = function(name)
            phase_check("kong.request.get_query_arg", REQ)
            return first(ngx.req.get_uri_args(100)[name])
        end,
        get_query = function(max_args)
            phase_check("kong.request.get_query", REQ)
            return ngx.req.get_uri_args(max_args or 100)
        end,
        get_body = function()
            phase_check("kong.request.get_body", GET_BODY)
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
        end,
    },
    client = {
        get_forwarded_ip = function()
            phase_check("kong.client.get_forwarded_ip", REQ)
            return ngx.var.remote_addr
        end,
    },
    response = {
        exit = function(status, body, headers)
            phase_check("kong.response.exit", EXIT)
            ngx.status = status
            for k, v in pairs(headers or {}) do
                ngx.header[k] = v
            end
            if body then
                ngx.print(body)
            end
            return ngx.exit(status)
        end,
        set_header = function(name, value)
            phase_check("kong.response.set_header", SET_HEADER)
            ngx.header[name] = value
        end,
        get_status = function()
            phase_check("kong.response.get_status", GET_STATUS)
            return ngx.status
        end,
    },
    service = {
        request = {
            set_header = function(name, value)
                phase_check("kong.service.request.set_header", EXIT)
                ngx.req.set_header(name, value)
            end,
            clear_header = function(name)
                phase_check("kong.service.request.clear_header", EXIT)
                ngx.req.clear_header(name)
            end,
        },
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
    if (field.type == "array" or field.type == "map") and field.elements
        and field.elements.type == "record" then
        local out = {}
        for i, v in ipairs(value) do
            out[i] = fill(field.elements, v)
        end
        return out
    end
    if field.type == "map" and field.values and field.values.type == "record" then
        local out = {}
        for k, v in pairs(value) do
            out[k] = fill(field.values, v)
        end
        return out
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
