-- resty.rl.redis.commands: the rl commands over lua-resty-redis.
--
-- Every call goes through resty.rl.redis.client (the mode: single, sentinel,
-- cluster; pooling and the time budget of one call). Any error, a timeout
-- included, returns nil and a message.

local transport = require "resty.rl.redis.client"
local connection = require "resty.rl.redis.connection"

local _M = {}

local null = ngx.null

-- The commands `cmds` over the configured Redis (resty.rl.redis.client: single,
-- sentinel or cluster), in one round trip per node.
local function run(conf, cmds)
    return transport.run(conf.redis, cmds)
end

-- The reply of a one-command call (`list`: that command alone), or nil
-- and an error (an error reply included).
local function one_of(conf, list)
    local res, err = run(conf, list)
    if not res then
        return nil, err
    end
    local r = res[1]
    if type(r) == "table" and r[1] == false then
        return nil, tostring(r[2])
    end
    return r
end

-- The reply of the command `cmd` (see one_of).
local function one(conf, cmd)
    return one_of(conf, { cmd })
end

-- A "none" field of a limiter reply (-1) as nil.
local function none(v)
    if v < 0 then
        return nil
    end
    return v
end
_M.none = none

--- True when `res` is the module's 8-integer limiter reply (RL.TAKE,
--- RL.WINDOW, RL.QUOTA): read where it is (resty.rl.limit.limiters' outcome,
--- without a decoded table per request) or through decode.
function _M.is_rate_reply(res)
    -- (eight tests without a loop: a loop here would end the access
    -- phase's trace, and the rest of the phase would run interpreted)
    -- (and none after them: no `#res`, a call into LuaJIT's runtime in a
    -- trace, resty.rl.base.hotpath.single)
    return type(res) == "table" and type(res[1]) == "number"
        and type(res[2]) == "number" and type(res[3]) == "number"
        and type(res[4]) == "number" and type(res[5]) == "number"
        and type(res[6]) == "number" and type(res[7]) == "number"
        and type(res[8]) == "number" and res[9] == nil
end

--- The one decoder of the module's 8-integer limiter reply (RL.TAKE,
--- RL.WINDOW, RL.QUOTA): a table of named fields, or nil when `res` is not
--- such a reply. Values the reference gives as "none" are nil:
--- retry_after_ms -1 (a manual box: no time to come back) and
--- strikes_remaining -1 (no STRIKES); reset_ms -1 (a manual box) too.
--- `binding` is the 0-based index of the bucket the reply describes.
function _M.decode(res)
    if not _M.is_rate_reply(res) then
        return nil
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
        -- the name of the policy it describes, when its caller shows it
        -- (resty.rl.format.headers.ratelimit): given here, not added later
        name = false,
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

--- `cmd` (a command: its name, then its arguments, which become strings)
--- with its RESP request (`resp`, sent as it is by resty.rl.redis.client.send)
--- and the integers of its reply (`ints`: read in one piece when it is
--- sent alone): for a command made once and sent many times, never
--- changed after (resty.rl.redis.client and resty.rl.redis.cluster only read it).
function _M.encoded(cmd, ints)
    for i, v in ipairs(cmd) do
        cmd[i] = tostring(v)
    end
    cmd.resp = "*" .. #cmd .. "\r\n" .. connection.encode(cmd)
    cmd.ints = ints
    return cmd
end

--- RL.LEASE ACQUIRE with `id` (the request id: new on every request) as
--- the lease id, so that the release names exactly this request's lease.
--- Returns {granted (bool), retry_after_ms} or nil and an error.
function _M.acquire(conf, key, max, ttl, id)
    local res, err = one(conf, { "RL.LEASE", "ACQUIRE", key, max, ttl, "ID", id })
    if not res then
        return nil, err
    end
    local d = _M.decode_lease(res)
    if not d then
        return nil, "unexpected reply"
    end
    return d
end

--- Sends `cmds` (each a list: command name, then its arguments) in one
--- pipelined round trip (per cluster node). Returns the list of raw
--- replies (an error reply of one command, in cluster mode an unreachable
--- node's too, is {false, "ERR ..."} in its place), or nil and an error
--- when no reply came.
function _M.pipeline(conf, cmds)
    return run(conf, cmds)
end

--- As pipeline, for commands that must all succeed (refunds, releases):
--- the replies, or nil and the first error (no reply, or an error reply).
function _M.pipeline_ok(conf, cmds)
    local res, err = run(conf, cmds)
    for _, r in ipairs(res or {}) do
        if type(r) == "table" and r[1] == false then
            return nil, r[2]
        end
    end
    return res, err
end

return _M
