-- resty.rl.redis.env: a policy's `redis` table from the environment (the
-- shipped examples and the sample policy), and what the policy's
-- validation then says of it.
local T = require "unit"
local redis_env = require "resty.rl.redis.env"
local config = require "resty.rl.policy.config"

-- A getenv over the table `vars`.
local function env(vars)
    return function(name) return vars[name] end
end

-- The sample policy with `redis`, built: its redis table, or the error.
local function built(redis)
    local ok, conf = pcall(config.build, { redis = redis })
    if ok then
        return conf.redis
    end
    return nil, tostring(conf)
end

T.cases("the environment's redis table", {
    { name = "nothing set: the defaults given", vars = {},
      want = { timeout_ms = 20 } },
    { name = "one server", vars = { RL_REDIS_HOST = "10.0.0.5", RL_REDIS_PORT = "6380" },
      want = { host = "10.0.0.5", port = 6380, timeout_ms = 20 } },
    { name = "cluster seeds", vars = { RL_REDIS_MODE = "cluster",
                                       RL_REDIS_NODES = "10.0.0.1:7000, 10.0.0.2:7000" },
      want = { mode = "cluster", nodes = { "10.0.0.1:7000", "10.0.0.2:7000" }, timeout_ms = 20 } },
    { name = "sentinel", vars = { RL_REDIS_MODE = "sentinel", RL_REDIS_SENTINELS = "s1:26379,s2:26379",
                                  RL_REDIS_MASTER_NAME = "rl", RL_REDIS_PASSWORD = "pw" },
      want = { mode = "sentinel", sentinels = { "s1:26379", "s2:26379" }, master_name = "rl",
               password = "pw", timeout_ms = 20 } },
    { name = "a budget", vars = { RL_REDIS_TIMEOUT_MS = "250" }, want = { timeout_ms = 250 } },
}, function(c)
    T.eq(redis_env.redis({ timeout_ms = 20 }, env(c.vars)), c.want)
end)

T.test("one server: the policy's defaults fill the rest", function()
    local r = assert(built(redis_env.redis({ timeout_ms = 20 }, env({ RL_REDIS_PORT = "6390" }))))
    T.eq({ r.mode, r.host, r.port, r.timeout_ms }, { "single", "127.0.0.1", 6390, 20 })
end)

T.test("cluster without RL_REDIS_NODES: the host and port are the seed", function()
    local r = assert(built(redis_env.redis({ timeout_ms = 20 },
        env({ RL_REDIS_MODE = "cluster", RL_REDIS_HOST = "10.0.0.9", RL_REDIS_PORT = "7001" }))))
    T.eq(r.nodes, { "10.0.0.9:7001" })
end)

T.cases("a bad value stops the policy with the option named", {
    { name = "mode", vars = { RL_REDIS_MODE = "ring" }, err = "redis.mode must be single, cluster or sentinel" },
    { name = "port", vars = { RL_REDIS_PORT = "http" }, err = "redis.port must be an integer" },
    { name = "budget", vars = { RL_REDIS_TIMEOUT_MS = "soon" }, err = "redis.timeout_ms must be > 0" },
    { name = "sentinels", vars = { RL_REDIS_MODE = "sentinel", RL_REDIS_SENTINELS = "nohost" },
      err = "redis.sentinels must be a list" },
}, function(c)
    local r, err = built(redis_env.redis({ timeout_ms = 20 }, env(c.vars)))
    T.eq(r, nil)
    T.ok(err:find(c.err, 1, true), err)
end)
