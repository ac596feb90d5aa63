-- resty.rl.redis.connection: one connection to one Redis node, for
-- resty.rl.redis.client (single and sentinel modes) and resty.rl.redis.cluster: the
-- pools, the time budget of a call, the RESP encoding of a command, the
-- pipelined round trip (a reply of integers read in one piece), and the
-- helpers of replies and addresses.

local ok_resty, driver = pcall(require, "resty.redis")
if not ok_resty then
    -- Debian's lua-nginx-redis ships lua-resty-redis as nginx.redis
    driver = require "nginx.redis"
end

local memo = require "resty.rl.base.memo"
local hotpath = require "resty.rl.base.hotpath"

local _M = { driver = driver }

--- The key a command names (what routes it in a cluster): its first
--- argument, the second for RL.LEASE (a subcommand comes first).
function _M.key_of(cmd)
    local name = cmd[1]
    if name == "RL.LEASE" or name == "rl.lease" then
        return cmd[3]
    end
    return cmd[2]
end

--- A flat key/value array (an HGETALL reply, a RESP2 map) as a table.
function _M.flat_map(arr)
    local t = {}
    for i = 1, #arr - 1, 2 do
        t[arr[i]] = arr[i + 1]
    end
    return t
end

--- A deadline `timeout_ms` from now (ms since the epoch). ngx.now() is
--- the time the event loop last woke up: refreshed first, or the budget
--- would start in the past.
function _M.deadline(rconf)
    ngx.update_time()
    return ngx.now() * 1000 + rconf.timeout_ms
end

-- What is left of the budget (ms), nil when nothing is; `fresh`: the
-- clock was refreshed since the last I/O (ngx.update_time() formats
-- nginx's cached time strings: too dear to call twice in a row).
local function left(deadline, fresh)
    if not fresh then
        ngx.update_time()
    end
    local ms = deadline - ngx.now() * 1000
    if ms < 1 then
        return nil
    end
    return ms
end

-- The connect options of a node (its pool: one per node and database),
-- made once per configuration and node (the database is the
-- configuration's: `redis.database`, none in cluster mode).
local pools = setmetatable({}, { __mode = "k" })
local function new_pool_options(host, port, rconf, database)
    return { pool = "rl:" .. host .. ":" .. port .. ":" .. (database or 0),
             pool_size = rconf.pool_size }
end
local function pool_options(rconf, host, port, database)
    local m = pools[rconf]
    if not m then
        m = memo.new(1000)
        pools[rconf] = m
    end
    return m:peek(host, port) or m:get(host, port, new_pool_options, rconf, database)
end

--- A pooled connection to host:port (one pool per node and database),
--- authenticated and on its database at first use; nil and an error.
--- `fresh`: the deadline was just made (no I/O since).
function _M.connect(rconf, host, port, deadline, database, fresh)
    local ms = left(deadline, fresh)
    if not ms then
        return nil, "timeout (no budget left to connect)"
    end
    local red, err = driver:new()
    if not red then
        return nil, err
    end
    red:set_timeout(ms)
    local ok
    ok, err = red:connect(host, port, pool_options(rconf, host, port, database))
    if not ok then
        return nil, "connect " .. host .. ":" .. port .. ": " .. tostring(err)
    end
    if red:get_reused_times() > 0 then
        -- from the pool: no I/O since `ms` was measured
        return red
    end
    if rconf.password then
        ok, err = red:auth(rconf.password)
        if not ok then
            red:close()
            return nil, "auth: " .. tostring(err)
        end
    end
    if database then
        ok, err = red:select(database)
        if not ok then
            red:close()
            return nil, "select: " .. tostring(err)
        end
    end
    ms = left(deadline)
    if not ms then
        red:close()
        return nil, "timeout (connect used the budget)"
    end
    red:set_timeout(ms)
    return red
end

--- Back into the pool (or closed when the pool refuses it).
function _M.keepalive(red, rconf)
    local ok = red:set_keepalive(rconf.keepalive_ms, rconf.pool_size)
    if not ok then
        red:close()
    end
end

--- The RESP encoding of `args` (strings or numbers) as one string: the
--- fixed part of a command, encoded once (see `send`).
function _M.encode(args)
    local out = {}
    for i, a in ipairs(args) do
        a = tostring(a)
        out[i] = "$" .. #a .. "\r\n" .. a .. "\r\n"
    end
    return table.concat(out)
end

--- The integers of `buf` when it is exactly the RESP array of `n`
--- integers ("*<n>\r\n" then n times ":<int>\r\n"; `n` nil: as many
--- as it says, at most MAX_INTS), else nil (a reply not complete yet, or
--- another shape). Read byte by byte: a pattern with n captures costs
--- LuaJIT about 8,300 instructions for the limiter's 8 integers (it is
--- not compiled, and makes a string per capture), this about 2,400.
local byte = string.byte
local new_table = hotpath.new_table
local MAX_INTS = 64
local function int_array(buf, n)
    if byte(buf, 1) ~= 42 then -- "*"
        return nil
    end
    local pos, count = 2, 0
    local c = byte(buf, pos)
    while c and c >= 48 and c <= 57 do
        count, pos = count * 10 + c - 48, pos + 1
        c = byte(buf, pos)
    end
    if pos == 2 or (n and count ~= n) or count > MAX_INTS or c ~= 13
        or byte(buf, pos + 1) ~= 10 then
        return nil
    end
    pos = pos + 2
    local out = new_table(count, 0)
    for i = 1, count do
        if byte(buf, pos) ~= 58 then -- ":"
            return nil
        end
        pos = pos + 1
        local negative = byte(buf, pos) == 45 -- "-"
        if negative then
            pos = pos + 1
        end
        local v, first = 0, pos
        c = byte(buf, pos)
        while c and c >= 48 and c <= 57 do
            v, pos = v * 10 + c - 48, pos + 1
            c = byte(buf, pos)
        end
        if pos == first or c ~= 13 or byte(buf, pos + 1) ~= 10 then
            return nil
        end
        out[i] = negative and -v or v
        pos = pos + 2
    end
    if pos ~= #buf + 1 then
        return nil
    end
    return out
end
_M.int_array = int_array

-- The reply of one command that answers an array of `n` integers (the
-- limiter replies), read in one piece: lua-resty-redis has no call for
-- that and reads one line per element (a `receive` each, the dearest part
-- of the allowed path's reply; see bench/RESULTS.md). Returns the
-- integers (as many as the reply has: its decoder checks them),
-- {false, message} for an error reply (as the driver gives one), or nil
-- and an error: a timeout, or any other shape (the caller then closes
-- the connection).
local MAX_READS = 16
local function read_int_array(sock, n)
    local buf
    for _ = 1, MAX_READS do
        local data, err = sock:receiveany(4096)
        if not data then
            return nil, err
        end
        buf = buf and buf .. data or data
        local out = int_array(buf)
        if out then
            return out
        end
        local msg = buf:match("^%-(.-)\r\n$")
        if msg then
            return { false, msg }
        end
        local _, lines = buf:gsub("\r\n", "")
        if lines > n then
            return nil, "unexpected reply"
        end
    end
    return nil, "unexpected reply"
end

--- Sends `cmds` on `red` in one pipeline; `asking[i]` sends ASKING
--- before command i (its OK is not returned). A command with a `resp`
--- field (its RESP request as a list of strings, the fixed parts made by
--- `encode` once) goes into the driver's pipeline as it is: the driver
--- would format every argument of every call. A command alone with
--- `ints` (its reply is an array of that many integers) is read in one
--- piece. Returns one reply per command (an error reply is {false,
--- "ERR ..."} in its place), or nil and an error (the connection is then
--- closed).
function _M.send(red, cmds, asking)
    local one = hotpath.single(cmds)
    local sock = rawget(red, "_sock")
    if one and not asking and one.ints and sock then
        -- one limiter call (the tier form's RL.TAKE, a rule's command): its
        -- reply in one read; a request without `resp` encoded by the driver
        local req = one.resp
        if not req then
            red:init_pipeline()
            red[one[1]](red, unpack(one, 2))
            req = rawget(red, "_reqs")
            red:cancel_pipeline()
        end
        local bytes, err = sock:send(req)
        local reply
        if bytes then
            reply, err = read_int_array(sock, one.ints)
        end
        if not reply then
            red:close()
            return nil, err
        end
        return { reply }
    end
    red:init_pipeline()
    -- lua-resty-redis's pipeline: the encoded requests, sent by
    -- commit_pipeline, one reply read per entry
    local reqs = rawget(red, "_reqs")
    for i, c in ipairs(cmds) do
        if asking and asking[i] then
            red:asking()
        end
        if c.resp and type(reqs) == "table" then
            reqs[#reqs + 1] = c.resp
        else
            red[c[1]](red, unpack(c, 2))
        end
    end
    local res, err = red:commit_pipeline()
    if not res then
        red:close()
        return nil, err
    end
    if not asking then
        return res
    end
    local out, j = {}, 1
    for i = 1, #cmds do
        if asking[i] then
            j = j + 1
        end
        out[i] = res[j]
        j = j + 1
    end
    return out
end

--- One round trip to host:port: the replies, or nil and an error.
function _M.on_node(rconf, host, port, cmds, deadline, database, fresh)
    local red, err = _M.connect(rconf, host, port, deadline, database, fresh)
    if not red then
        return nil, err
    end
    local res
    res, err = _M.send(red, cmds)
    if not res then
        return nil, err
    end
    _M.keepalive(red, rconf)
    return res
end

--- Splits "host:port" into host, port (a number).
function _M.addr(s)
    local host, port = s:match("^(.+):(%d+)$")
    return host, tonumber(port)
end

return _M
