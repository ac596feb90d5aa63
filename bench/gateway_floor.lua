-- The floor of `make bench-gateway` (bench/gateway.sh): one bare pooled
-- INCR per request, with the driver the gateway uses (lua-resty-redis, as
-- resty.redis or Debian's nginx.redis) and its pool size. What any gateway
-- that asks Redis once per request pays at least.
local ok, redis = pcall(require, "resty.redis")
if not ok then
    redis = require "nginx.redis"
end

local _M = {}

local host = os.getenv("RL_REDIS_HOST") or "127.0.0.1"
local port = tonumber(os.getenv("RL_REDIS_PORT") or "6379")

--- access_by_lua: INCR one key, or 502 when Redis fails.
function _M.access()
    local red = redis:new()
    red:set_timeout(1000)
    local okc = red:connect(host, port, { pool_size = 64 })
    if not okc then
        return ngx.exit(502)
    end
    local n = red:incr("bench:floor")
    if not n then
        red:close()
        return ngx.exit(502)
    end
    red:set_keepalive(60000, 64)
end

return _M
