-- Kong plugin "rl": a thin front end over resty.rl.gateway (the same
-- library and the same options as the nginx front end). It uses only the
-- Kong PDK (kong.request, kong.client, kong.response, kong.ctx.plugin,
-- kong.log); Redis is reached by the library through lua-resty-redis.

local gateway = require "resty.rl.gateway"
local tier_form = require "resty.rl.policy.tier_form"
local cjson = require "cjson.safe"

local RlHandler = {
    -- after authentication plugins (which set the consumer; Kong runs the
    -- higher priority first), and after the bundled rate-limiting plugin
    -- (910), were it configured too
    PRIORITY = 905,
    VERSION = "0.1.0",
}

-- One gateway per plugin configuration (Kong hands the same table to
-- every request until the configuration changes).
local gateways = setmetatable({}, { __mode = "k" })

local function get(conf)
    local gw = gateways[conf]
    if not gw then
        -- a rule policy (the schema's `policy`, JSON) is the whole configuration
        local rule_policy = conf.policy ~= nil and conf.policy ~= ngx.null
            and cjson.decode(conf.policy)
        -- Kong fills unset optional fields with ngx.null: they are dropped,
        -- so that the library's defaults apply
        gw = gateway.new(rule_policy or tier_form.without_nulls(conf, true))
        gateways[conf] = gw
    end
    return gw
end

-- The request adapter of resty.rl.gateway over the Kong PDK.
local adapter = {
    header = function(name)
        return kong.request.get_header(name)
    end,
    -- every value of a request header: a string, a list for a repeated
    -- one, or nil
    header_values = function(name)
        return kong.request.get_headers(1000)[name]
    end,
    method = function()
        return kong.request.get_method()
    end,
    path = function()
        return kong.request.get_path()
    end,
    -- every value of a repeated argument (get_query_arg gives the first
    -- only): the library refuses arguments whose values disagree
    query_arg = function(name)
        return kong.request.get_query(1000)[name]
    end,
    -- nil, "too_large" for a body the PDK does not read (kept in a temp
    -- file by nginx, or above the PDK's file limit); nil, "unsupported"
    -- for a body of a media type the PDK does not parse
    body_arg = function(name)
        local body, err = kong.request.get_body()
        if body == nil and err and (err:find("did not fit", 1, true)
            or err:find("too big", 1, true)) then
            return nil, "too_large"
        end
        if body == nil and err and err:find("unsupported content type", 1, true) then
            return nil, "unsupported"
        end
        return type(body) == "table" and body[name] or nil
    end,
    client_ip = function()
        return kong.client.get_forwarded_ip()
    end,
    request_id = function()
        return ngx.var.request_id
    end,
    ctx = function()
        return kong.ctx.plugin
    end,
    exit = function(status, body, headers)
        return kong.response.exit(status, body, headers)
    end,
    set_header = function(name, value)
        kong.response.set_header(name, value)
    end,
    -- a request header for the upstream (nil: removed)
    set_upstream_header = function(name, value)
        if value == nil then
            kong.service.request.clear_header(name)
        else
            kong.service.request.set_header(name, value)
        end
    end,
    -- bytes of the response body sent (log phase): egress quotas
    bytes_sent = function()
        return tonumber(ngx.var.body_bytes_sent)
    end,
    status = function()
        return kong.response.get_status()
    end,
    warn = function(msg)
        kong.log.warn(msg)
    end,
}

-- The phase handlers, `RlHandler:<phase>(conf)`: the gateway's phase of
-- the same name. One function each, not closures of one function over
-- the phase's name: LuaJIT starts a trace at a hot function, and one
-- function for every phase would have one root trace, which the other
-- phases leave at once, through its exits, for traces of their own.

--- access: the decision (may end the request).
function RlHandler:access(conf)
    return get(conf):access(adapter)
end

--- header_filter: the RateLimit fields decided in the access phase.
function RlHandler:header_filter(conf)
    return get(conf):header_filter(adapter)
end

--- body_filter: post-paid rules (`settle.from = "usage"`) read the
--- response's usage (nothing for the others).
function RlHandler:body_filter(conf)
    return get(conf):body_filter(adapter)
end

--- log: counters, the structured log line, lease release and
--- failed-login records (in a timer).
function RlHandler:log(conf)
    return get(conf):log(adapter)
end

return RlHandler
