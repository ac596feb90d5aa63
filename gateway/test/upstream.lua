-- The upstream of the end-to-end tests: echoes the request as JSON, holds
-- it for `hold` seconds when asked (lease and concurrent-login tests), and plays a token
-- endpoint: client alice with secret "right" gets a token; an unknown
-- client and a bad secret get the same 401.
local cjson = require "cjson.safe"

local _M = {}

--- The post-paid upstream (`/v1/llm/...`, tests/gateway_settle.rs):
--- `usage_header=N` sets X-Usage-Tokens: N; `tokens=N` answers an
--- OpenAI-compatible chat completion with usage.total_tokens N (`stream=1`:
--- as server-sent events, each chunk flushed, the usage chunk split across
--- two writes); `bytes=N` answers N bytes of text.
function _M.llm(args)
    if args.usage_header then
        ngx.header["X-Usage-Tokens"] = args.usage_header
    end
    local bytes = tonumber(args.bytes)
    if bytes then
        ngx.header["Content-Type"] = "text/plain"
        ngx.print(string.rep("x", math.min(bytes, 10 * 1024 * 1024)))
        return
    end
    local tokens = tonumber(args.tokens)
    if not tokens then
        ngx.say('{"ok":true}')
        return
    end
    local usage = { prompt_tokens = 1, completion_tokens = tokens - 1, total_tokens = tokens }
    if args.stream ~= "1" then
        ngx.say(cjson.encode({ id = "c1", object = "chat.completion", choices = {
            { index = 0, message = { role = "assistant", content = "total_tokens: 1" } } },
            usage = usage }))
        return
    end
    ngx.header["Content-Type"] = "text/event-stream"
    for i = 1, 5 do
        -- a content that mentions the usage's name is not the usage
        ngx.print("data: ", cjson.encode({ id = "c1", object = "chat.completion.chunk",
            choices = { { index = 0, delta = { content = "\"total_tokens\": 7 #" .. i } } } }),
            "\n\n")
        ngx.flush(true)
    end
    local last = "data: " .. cjson.encode({ id = "c1", object = "chat.completion.chunk",
        choices = {}, usage = usage }) .. "\n\n"
    local half = math.floor(#last / 2)
    ngx.print(last:sub(1, half))
    ngx.flush(true)
    ngx.sleep(0.05)
    ngx.print(last:sub(half + 1), "data: [DONE]\n\n")
end

-- The request body (kept in memory or, when large, in a file).
local function body()
    ngx.req.read_body()
    local data = ngx.req.get_body_data()
    if not data then
        local f = io.open(ngx.req.get_body_file() or "", "rb")
        data = f and f:read("*a")
        if f then
            f:close()
        end
    end
    return data
end

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
        local keys = cjson.decode(body() or "[]") or {}
        local slots = {}
        for i, k in ipairs(keys) do
            slots[i] = require("resty.rl.redis.cluster").keyslot(k)
        end
        ngx.say(cjson.encode(slots))
        return
    end
    if ngx.var.uri == "/int-array" then
        -- the gateway's reading of RESP replies of `n` integers, for each
        -- string of a JSON array: the integers, or null (tests/gateway_modes.rs)
        local replies = cjson.decode(body() or "[]") or {}
        local out = {}
        for i, r in ipairs(replies) do
            out[i] = require("resty.rl.redis.connection").int_array(r, tonumber(args.n)) or cjson.null
        end
        ngx.say(cjson.encode(out))
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
    if ngx.var.uri:find("^/v1/llm/") then
        return _M.llm(args)
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
