-- resty.rl.redis.client: how the gateway reaches Redis, by `redis.mode`:
--   single    one server (host, port);
--   sentinel  the primary named `master_name`, discovered from the
--             `sentinels` (lua-resty-redis-connector's sentinel module)
--             and followed across failovers;
--   cluster   Redis Cluster (resty.rl.redis.cluster: the slot map, one pool per
--             node, MOVED and ASK).
-- One entry point, run(rconf, cmds): the commands (each a list: command
-- name, then its arguments) in one pipelined round trip per node, within
-- the time budget `timeout_ms` for the whole call. Any connection error, a
-- timeout included, closes that connection (a half-read reply must never
-- go back into the pool).

local connection = require "resty.rl.redis.connection"
local cluster = require "resty.rl.redis.cluster"

local _M = {}

local driver = connection.driver

-- lua-resty-redis-connector's sentinel module (Debian:
-- lua-nginx-redis-connector), loaded with the library; nil when neither
-- is installed (sentinel mode then fails its calls, saying so).
local sentinel_mod
do
    local ok, m = pcall(require, "resty.redis.sentinel")
    if not ok then
        ok, m = pcall(require, "nginx.redis.sentinel")
    end
    sentinel_mod = ok and m or nil
end

-- Sentinel mode: the primary's address per worker, asked again from the
-- sentinels after refresh_ms, at once after a connection error or a
-- READONLY reply (the old primary, now a replica).
local primaries = {}

local sentinel_ready = false
local function sentinel_module()
    if not sentinel_ready then
        driver.add_commands("sentinel")
        sentinel_ready = true
    end
    return sentinel_mod
end

--- The current primary of a sentinel configuration: host, port, or nil
--- and an error (no sentinel answered, or none knows the primary).
function _M.primary(rconf, deadline)
    local ns = rconf.master_name .. "@" .. rconf.sentinels[1]
    local p = primaries[ns]
    if p and ngx.now() * 1000 < p.expires then
        return p.host, p.port
    end
    local mod = sentinel_module()
    if not mod then
        return nil, "sentinel mode needs lua-resty-redis-connector (resty.redis.sentinel)"
    end
    local get_master = mod.get_master
    local errs = {}
    for _, s in ipairs(rconf.sentinels) do
        local host, port = connection.addr(s)
        local red, err = connection.connect({ pool_size = rconf.pool_size,
            password = rconf.sentinel_password }, host, port, deadline)
        if red then
            local m
            m, err = get_master(red, rconf.master_name)
            if m then
                connection.keepalive(red, rconf)
                primaries[ns] = { host = m.host, port = tonumber(m.port),
                                  expires = ngx.now() * 1000 + rconf.refresh_ms }
                return m.host, tonumber(m.port)
            end
            red:close()
        end
        errs[#errs + 1] = s .. ": " .. tostring(err or "no primary")
    end
    return nil, "sentinels: " .. table.concat(errs, "; ")
end

-- Forgets the primary (the next call asks the sentinels).
local function forget_primary(rconf)
    primaries[rconf.master_name .. "@" .. rconf.sentinels[1]] = nil
end

--- Runs `cmds` (see the file comment). Returns one reply per command (an
--- error reply in its place, as {false, "ERR ..."}: in cluster mode a
--- node that cannot be reached answers such an error for its commands),
--- or nil and an error when no reply came at all.
function _M.run(rconf, cmds)
    if cmds[1] == nil then
        return {}
    end
    local deadline = connection.deadline(rconf)
    local mode = rconf.mode
    if mode == "cluster" then
        return cluster.run(rconf, cmds, deadline)
    elseif mode == "sentinel" then
        local host, port = _M.primary(rconf, deadline)
        if not host then
            return nil, port
        end
        local res, err = connection.on_node(rconf, host, port, cmds, deadline, rconf.database)
        if not res then
            forget_primary(rconf)
            return nil, err
        end
        for _, r in ipairs(res) do
            if type(r) == "table" and r[1] == false and tostring(r[2]):find("^READONLY") then
                -- a failover demoted it: nothing was written; ask again
                forget_primary(rconf)
                return nil, "primary " .. host .. ":" .. port .. " is a replica now"
            end
        end
        return res
    end
    return connection.on_node(rconf, rconf.host, rconf.port, cmds, deadline, rconf.database, true)
end

return _M
