-- The upstream of the end-to-end tests: echoes the request as JSON, holds
-- it for `hold` seconds when asked (lease and concurrent-login tests), and plays a token
-- endpoint: client alice with secret "right" gets a token; an unknown
-- client and a bad secret get the same 401.
local cjson = require "cjson.safe"

local _M = {}

--- content_by_lua handler.
function _M.serve()
    ngx.header["Content-Type"] = "application/json"
    local args = ngx.req.get_uri_args()
    local hold = tonumber(args.hold)
    if hold then
        ngx.sleep(math.min(hold, 10))
    end
    if ngx.var.uri == "/keyslot" then
        -- the gateway's hash slots of a JSON array of keys (tests/gateway_cluster.rs)
        ngx.req.read_body()
        local body = ngx.req.get_body_data()
        if not body then
            local f = io.open(ngx.req.get_body_file() or "", "rb")
            body = f and f:read("*a")
            if f then
                f:close()
            end
        end
        local keys = cjson.decode(body or "[]") or {}
        local slots = {}
        for i, k in ipairs(keys) do
            slots[i] = require("resty.rl.cluster").keyslot(k)
        end
        ngx.say(cjson.encode(slots))
        return
    end
    if ngx.var.uri == "/v1/auth/token" then
        ngx.req.read_body()
        local form = ngx.req.get_post_args() or {}
        if form.client_id == "alice" and form.client_secret == "right" then
            ngx.say('{"access_token":"t0k3n","token_type":"Bearer"}')
        else
            ngx.status = 401
            ngx.say('{"error":"invalid_client"}')
        end
        return
    end
    local status = tonumber(args.status)
    if status then
        -- a payment provider's answer (402: a failed payment), ...
        ngx.status = status
    end
    local out = { method = ngx.req.get_method(), uri = ngx.var.uri }
    -- what the gateway told the upstream (soft blocks, priority, tier)
    local marks = {}
    for name, v in pairs(ngx.req.get_headers(100)) do
        if name:find("^x%-kyc") or name:find("^x%-ratelimit") then
            marks[name] = v
        end
    end
    if next(marks) then
        out.marks = marks
    end
    ngx.say(cjson.encode(out))
end

return _M
