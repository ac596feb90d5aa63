-- resty.rl.store: the rl commands over lua-resty-redis.
--
-- Each function opens (or reuses, from the cosocket pool) one connection
-- with the configured time budget on connect, send and read, runs its
-- command(s) and returns the connection to the pool. Any error, a timeout
-- included, returns nil and a message, and the connection is closed (a
-- half-read reply must never go back into the pool).

local ok_resty, redis = pcall(require, "resty.redis")
if not ok_resty then
    -- Debian's lua-nginx-redis ships lua-resty-redis as nginx.redis
    redis = require "nginx.redis"
end

local _M = {}

local null = ngx.null

local function connect(rconf)
    local red, err = redis:new()
    if not red then
        return nil, err
    end
    red:set_timeout(rconf.timeout_ms)
    local ok
    ok, err = red:connect(rconf.host, rconf.port, {
        pool = "rl:" .. rconf.host .. ":" .. rconf.port .. ":" .. (rconf.database or 0),
        pool_size = rconf.pool_size,
    })
    if not ok then
        return nil, "connect: " .. tostring(err)
    end
    if red:get_reused_times() == 0 then
        if rconf.password then
            ok, err = red:auth(rconf.password)
            if not ok then
                red:close()
                return nil, "auth: " .. tostring(err)
            end
        end
        if rconf.database then
            ok, err = red:select(rconf.database)
            if not ok then
                red:close()
                return nil, "select: " .. tostring(err)
            end
        end
    end
    return red
end

local function done(red, rconf)
    local ok = red:set_keepalive(rconf.keepalive_ms, rconf.pool_size)
    if not ok then
        red:close()
    end
end

-- Runs `fn(red)` on a pooled connection within the time budget: what
-- the connection took is deducted from the budget of the command (so a
-- call takes about timeout_ms at most, not one per socket operation).
-- Returns what fn returns, or nil and an error (the connection is then
-- closed).
local function with_redis(rconf, fn)
    -- ngx.now() is the time the event loop last woke up: refresh it, or
    -- the budget would start in the past
    ngx.update_time()
    local deadline = ngx.now() * 1000 + rconf.timeout_ms
    local red, err = connect(rconf)
    if not red then
        return nil, err
    end
    -- ngx.now() is refreshed by the event loop after a yield (a new connect)
    local left = deadline - ngx.now() * 1000
    if left < 1 then
        red:close()
        return nil, "timeout (connect used the budget)"
    end
    red:set_timeout(left)
    local res
    res, err = fn(red)
    if res == nil then
        red:close()
        return nil, err
    end
    done(red, rconf)
    return res
end

--- The one decoder of the module's 8-integer limiter reply (RL.TAKE,
--- RL.WINDOW, RL.QUOTA): a table of named fields, or nil when `res` is not
--- such a reply. Values the reference gives as "none" are nil:
--- retry_after_ms -1 (a manual box: no time to come back) and
--- strikes_remaining -1 (no STRIKES); reset_ms -1 (a manual box) too.
--- `binding` is the 0-based index of the bucket the reply describes.
function _M.decode(res)
    if type(res) ~= "table" or #res ~= 8 then
        return nil
    end
    for i = 1, 8 do
        if type(res[i]) ~= "number" then
            return nil
        end
    end
    local function none(v)
        if v < 0 then
            return nil
        end
        return v
    end
    return {
        status = res[1],
        limit = res[2],
        remaining = res[3],
        reset_ms = none(res[4]),
        retry_after_ms = none(res[5]),
        box_level = res[6],
        strikes_remaining = none(res[7]),
        binding = res[8],
    }
end

--- The decoder of an RL.LEASE ACQUIRE reply [granted, lease-id, in_use,
--- max, retry_after_ms]: {granted, lease_id, in_use, max, retry_after_ms}
--- (retry_after_ms: until the earliest live lease expires, when full), or
--- nil when `res` is not such a reply.
function _M.decode_lease(res)
    if type(res) ~= "table" or #res ~= 5 or type(res[1]) ~= "number"
        or type(res[3]) ~= "number" or type(res[5]) ~= "number" then
        return nil
    end
    local granted = res[1] == 1 and res[2] ~= null
    return { granted = granted, lease_id = granted and res[2] or nil, in_use = res[3],
             max = res[4], retry_after_ms = res[5] }
end

-- Checks and decodes an 8-integer limiter reply.
local function limiter_reply(res, err)
    if not res then
        return nil, err
    end
    local d = _M.decode(res)
    if not d then
        return nil, "unexpected reply"
    end
    return d
end

--- RL.TAKE on the caller's key and tenant buckets, with the tier's strikes
--- and boxes. Returns the decoded reply (see decode) or nil and an error.
function _M.take(conf, key, tenant_key, tier, cost)
    return with_redis(conf.redis, function(red)
        local s = tier.strikes
        return limiter_reply(red["RL.TAKE"](red,
            key, tier.key.burst, tier.key.rate, tier.period,
            "COST", cost,
            "ALSO", tenant_key, tier.tenant.burst, tier.tenant.rate, tier.period,
            "STRIKES", s.threshold, s.window,
            "BOX", tier.box[1], tier.box[2], tier.box[3],
            "OFFENSES", tier.offenses_ttl))
    end)
end

-- The arguments of RL.WINDOW for one failed-login counter.
local function window_args(key, w, box, cost)
    if cost == 0 then
        return { key, w.limit, w.window, "COST", 0 }
    end
    return { key, w.limit, w.window, "COST", cost,
        "STRIKES", 1, w.window, "BOX", box[1], box[2], box[3] }
end

--- Failed-login counters, pipelined: for each {key, limits} of `pairs_`
--- one RL.WINDOW with `cost` (0: a probe that writes nothing; 1: a failure
--- recorded, the failure that does not fit trips the box). Returns the
--- list of decoded replies (see decode), or nil and an error.
function _M.auth_windows(conf, pairs_, cost)
    return with_redis(conf.redis, function(red)
        red:init_pipeline(#pairs_)
        for _, p in ipairs(pairs_) do
            red["RL.WINDOW"](red, unpack(window_args(p[1], p[2], conf.auth.box, cost)))
        end
        local res, err = red:commit_pipeline()
        if not res then
            return nil, err
        end
        local out = {}
        for i = 1, #pairs_ do
            local r = res[i]
            out[i] = _M.decode(r)
            if not out[i] then
                -- an error reply comes back as {false, "ERR ..."}
                return nil, "RL.WINDOW: " .. tostring(type(r) == "table" and r[2] or r)
            end
        end
        return out
    end)
end

--- RL.LEASE ACQUIRE with `id` (the request id: new on every request) as
--- the lease id, so that the release names exactly this request's lease.
--- Returns {granted (bool), retry_after_ms} or nil and an error.
function _M.acquire(conf, key, max, ttl, id)
    return with_redis(conf.redis, function(red)
        local res, err = red["RL.LEASE"](red, "ACQUIRE", key, max, ttl, "ID", id)
        if not res then
            return nil, err
        end
        local d = _M.decode_lease(res)
        if not d then
            return nil, "unexpected reply"
        end
        return d
    end)
end

--- Sends `cmds` (each a list: command name, then its arguments) in one
--- pipeline, one round trip. Returns the list of raw replies (an error
--- reply of one command is {false, "ERR ..."} in its place), or nil and an
--- error when the round trip itself failed.
function _M.pipeline(conf, cmds)
    if #cmds == 0 then
        return {}
    end
    return with_redis(conf.redis, function(red)
        red:init_pipeline(#cmds)
        for _, c in ipairs(cmds) do
            red[c[1]](red, unpack(c, 2))
        end
        return red:commit_pipeline()
    end)
end

--- RL.LEASE RELEASE of each {key, id} in `leases`, pipelined. Returns
--- true or nil and an error.
function _M.release(conf, leases)
    if #leases == 0 then
        return true
    end
    return with_redis(conf.redis, function(red)
        red:init_pipeline(#leases)
        for _, l in ipairs(leases) do
            red["RL.LEASE"](red, "RELEASE", l.key, l.id)
        end
        local res, err = red:commit_pipeline()
        if not res then
            return nil, err
        end
        return true
    end)
end

return _M
