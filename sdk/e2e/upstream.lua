-- The stand-in API behind the gateway in the SDK end-to-end tests. It
-- echoes the request as JSON and keeps idempotency keys in the shared dict
-- `sdk_idem`: the first request with a key is processed, a repeat is
-- answered as a replay (`"replayed": true`) without processing it again.
-- `?fail_first=1`: the first request with a key is processed but answered
-- 503 with Retry-After: 1 (a response lost after the work was done).
-- `?hold=S`: holds the request S seconds (at most 10) after counting it.
-- `GET /_count?key=K` (on the upstream port itself): {received, processed}.
local cjson = require "cjson.safe"

local _M = {}

local function reply(status, body)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode(body))
end

--- content_by_lua handler.
function _M.serve()
    local idem = ngx.shared.sdk_idem
    local args = ngx.req.get_uri_args()
    if ngx.var.uri == "/_count" then
        local key = tostring(args.key or "")
        return reply(200, { received = idem:get("received:" .. key) or 0,
                            processed = idem:get("processed:" .. key) or 0 })
    end
    local key = ngx.var.http_idempotency_key
    local replayed = false
    if key then
        idem:incr("received:" .. key, 1, 0)
        local first = idem:add("processed:" .. key, 1)
        replayed = not first
    end
    local hold = tonumber(args.hold)
    if hold then
        ngx.sleep(math.min(hold, 10))
    end
    if key and not replayed and args.fail_first then
        ngx.header["Retry-After"] = "1"
        return reply(503, { error = "try again", idempotency_key = key })
    end
    reply(200, { method = ngx.req.get_method(), uri = ngx.var.uri,
                 idempotency_key = key or cjson.null, replayed = replayed })
end

return _M
