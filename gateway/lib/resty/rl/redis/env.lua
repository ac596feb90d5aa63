-- The `redis` table of a policy from the environment, so that one policy
-- file runs against one server, Sentinel or Cluster without an edit (the
-- shipped examples and the sample policy use it). What it returns is
-- validated with the rest of the policy: a bad value stops nginx with the
-- `redis.*` option named. nginx clears the environment: each variable read
-- needs an `env` line in nginx.conf.
--
--   RL_REDIS_MODE          single (default), cluster or sentinel
--   RL_REDIS_HOST, _PORT   single: the server (default 127.0.0.1:6379);
--                          cluster: the seed when RL_REDIS_NODES is unset
--   RL_REDIS_NODES         cluster: seed nodes "host:port,host:port"
--   RL_REDIS_SENTINELS     sentinel: the sentinels "host:port,host:port"
--   RL_REDIS_MASTER_NAME   sentinel: the name they monitor (default mymaster)
--   RL_REDIS_PASSWORD      AUTH on new connections (default none)
--   RL_REDIS_TIMEOUT_MS    the Redis budget (default: the policy's own)

local _M = {}

-- "a:1, b:2" -> { "a:1", "b:2" }
local function list(s)
    local out = {}
    for item in s:gmatch("[^,%s]+") do
        out[#out + 1] = item
    end
    return out
end

-- A number where the text is one; the text itself otherwise (so that the
-- policy's validation names the option rather than a default hiding it).
local function number_or_text(s)
    return s and (tonumber(s) or s)
end

--- The `redis` table: `defaults` (any `redis` fields, e.g. `timeout_ms`)
--- overridden by the environment. `getenv` defaults to `os.getenv`.
function _M.redis(defaults, getenv)
    getenv = getenv or os.getenv
    local t = {}
    for k, v in pairs(defaults or {}) do
        t[k] = v
    end
    t.mode = getenv("RL_REDIS_MODE") or t.mode
    t.host = getenv("RL_REDIS_HOST") or t.host
    t.port = number_or_text(getenv("RL_REDIS_PORT")) or t.port
    local nodes, sentinels = getenv("RL_REDIS_NODES"), getenv("RL_REDIS_SENTINELS")
    t.nodes = nodes and list(nodes) or t.nodes
    t.sentinels = sentinels and list(sentinels) or t.sentinels
    t.master_name = getenv("RL_REDIS_MASTER_NAME") or t.master_name
    t.password = getenv("RL_REDIS_PASSWORD") or t.password
    t.timeout_ms = number_or_text(getenv("RL_REDIS_TIMEOUT_MS")) or t.timeout_ms
    return t
end

return _M
