-- resty.rl.redis.cluster: Redis Cluster for the gateway (redis.mode = "cluster").
-- No cluster client for nginx's Lua is packaged for Debian; this one is
-- small and does only what the gateway needs:
--   * the key's slot: CRC16 (XMODEM) of its hash tag modulo 16384, as
--     Redis computes it (keyslot);
--   * the slot map from CLUSTER SHARDS (Redis >= 7), else CLUSTER SLOTS,
--     asked of the seed `nodes` or of the nodes of the current map; kept
--     in the shared dict `redis.dict` (one map per nginx node, every
--     worker decodes it once per version). A refresh runs in a timer, at
--     most one per `refresh_ms` per nginx node (a lock in the dict: no
--     thundering herd when many requests see MOVED at once);
--   * the commands of one call grouped by node, one pipeline per node
--     (nodes in parallel, light threads), one connection pool per node;
--   * MOVED: the command is retried once on the node named, and the map
--     refreshed; ASK: retried once on the node named, after ASKING;
--   * TRYAGAIN, CLUSTERDOWN, a second redirection and an unreachable node
--     stay error replies in place of their commands: the caller treats
--     them as Redis failures (the route's fail mode applies). An
--     unreachable node also triggers a refresh (a failover may have
--     replaced it).
-- Redirections are counted in the metrics dict (resty.rl.observe.metrics).

local bit = require "bit"
local transport = require "resty.rl.redis.connection"
local metrics = require "resty.rl.observe.metrics"

local band, bxor, lshift, rshift = bit.band, bit.bxor, bit.lshift, bit.rshift

local _M = {}

local SLOTS = 16384

-- CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), a byte at a time.
local CRC_TABLE = {}
for i = 0, 255 do
    local c = lshift(i, 8)
    for _ = 1, 8 do
        if band(c, 0x8000) ~= 0 then
            c = bxor(lshift(c, 1), 0x1021)
        else
            c = lshift(c, 1)
        end
        c = band(c, 0xffff)
    end
    CRC_TABLE[i] = c
end

--- CRC16 (XMODEM) of the bytes of `s`, as Redis' crc16.c.
function _M.crc16(s)
    local crc = 0
    for i = 1, #s do
        crc = band(bxor(lshift(crc, 8), CRC_TABLE[bxor(rshift(crc, 8), s:byte(i))]), 0xffff)
    end
    return crc
end

--- The hash slot of `key`: when the key has a `{` followed later by a
--- `}` with at least one byte between the first `{` and the first `}`
--- after it, only those bytes are hashed; otherwise the whole key.
function _M.keyslot(key)
    local open = key:find("{", 1, true)
    if open then
        local close = key:find("}", open + 1, true)
        if close and close > open + 1 then
            key = key:sub(open + 1, close - 1)
        end
    end
    return _M.crc16(key) % SLOTS
end

-- The shared dict of the map, and the map's name in it (its seeds).
local function dict_of(rconf)
    local d = ngx.shared[rconf.dict]
    if not d then
        error("rl: redis.dict " .. tostring(rconf.dict) .. " is not a lua_shared_dict", 0)
    end
    return d, "cluster:" .. table.concat(rconf.nodes, ",")
end

-- Per worker: the decoded map of each cluster, with the version decoded.
local decoded = {}

-- The map as the dict has it: {version, owner = {[slot] = "host:port"},
-- nodes = {"host:port", ...}}, or nil before the first refresh.
local function current(rconf)
    local d, ns = dict_of(rconf)
    local version = d:get(ns .. ":version")
    if not version then
        return nil
    end
    local m = decoded[ns]
    if m and m.version == version then
        return m
    end
    local text = d:get(ns .. ":map")
    if not text then
        return nil
    end
    m = { version = version, owner = {}, nodes = {} }
    local seen = {}
    for first, last, addr in text:gmatch("(%d+) (%d+) (%S+)\n") do
        for s = tonumber(first), tonumber(last) do
            m.owner[s] = addr
        end
        if not seen[addr] then
            seen[addr] = true
            m.nodes[#m.nodes + 1] = addr
        end
    end
    decoded[ns] = m
    return m
end

local fields = transport.flat_map

--- The ranges {first, last, "host:port"} of a CLUSTER SHARDS reply (the
--- primary of each shard, when it is online), or nil.
function _M.parse_shards(res)
    if type(res) ~= "table" then
        return nil
    end
    local ranges = {}
    for _, shard in ipairs(res) do
        local s = type(shard) == "table" and fields(shard) or {}
        local primary
        for _, n in ipairs(type(s.nodes) == "table" and s.nodes or {}) do
            local f = type(n) == "table" and fields(n) or {}
            if f.role == "master" and f.health ~= "fail" then
                primary = f
            end
        end
        if primary and type(s.slots) == "table" then
            for i = 1, #s.slots - 1, 2 do
                ranges[#ranges + 1] = { tonumber(s.slots[i]), tonumber(s.slots[i + 1]),
                                        primary.ip .. ":" .. tostring(primary.port) }
            end
        end
    end
    return ranges
end

--- The ranges {first, last, "host:port"} of a CLUSTER SLOTS reply (an
--- empty address is the node asked, `asked_host`), or nil.
function _M.parse_slots(res, asked_host)
    if type(res) ~= "table" then
        return nil
    end
    local ranges = {}
    for _, r in ipairs(res) do
        if type(r) == "table" and type(r[3]) == "table" then
            local host = r[3][1]
            if type(host) ~= "string" or host == "" or host == "?" then
                host = asked_host
            end
            ranges[#ranges + 1] = { tonumber(r[1]), tonumber(r[2]), host .. ":" .. tostring(r[3][2]) }
        end
    end
    return ranges
end

-- Asks one node for the map: CLUSTER SHARDS, or CLUSTER SLOTS when the
-- server has no SHARDS (Redis < 7).
local function fetch_from(rconf, addr, deadline)
    local host, port = transport.addr(addr)
    local red, err = transport.connect(rconf, host, port, deadline)
    if not red then
        return nil, err
    end
    local res
    res, err = transport.send(red, { { "CLUSTER", "SHARDS" } })
    local ranges = res and type(res[1]) == "table" and res[1][1] ~= false
        and _M.parse_shards(res[1])
    if res and not ranges then
        res, err = transport.send(red, { { "CLUSTER", "SLOTS" } })
        ranges = res and type(res[1]) == "table" and res[1][1] ~= false
            and _M.parse_slots(res[1], host)
    end
    if not res then
        return nil, err
    end
    transport.keepalive(red, rconf)
    if not ranges or #ranges == 0 then
        return nil, "no slot map from " .. addr
    end
    return ranges
end

--- Fetches the map from the first node that answers (the current map's
--- nodes, then the seeds, each list from a random place: a node that
--- hangs is not always asked first) and stores it in the dict, under a
--- new version. Each node asked has the whole time budget. Returns true,
--- or nil and an error.
function _M.refresh(rconf)
    local d, ns = dict_of(rconf)
    local tried, errs = {}, {}
    local m = current(rconf)
    local candidates = {}
    for _, list in ipairs({ m and m.nodes or {}, rconf.nodes }) do
        local from = #list > 0 and math.random(#list) or 1
        for i = 0, #list - 1 do
            candidates[#candidates + 1] = list[(from - 1 + i) % #list + 1]
        end
    end
    for _, addr in ipairs(candidates) do
        if not tried[addr] then
            tried[addr] = true
            local ranges, err = fetch_from(rconf, addr, transport.deadline(rconf))
            if ranges then
                local lines = {}
                for i, r in ipairs(ranges) do
                    lines[i] = r[1] .. " " .. r[2] .. " " .. r[3] .. "\n"
                end
                d:set(ns .. ":map", table.concat(lines))
                d:incr(ns .. ":version", 1, 0)
                return true
            end
            errs[#errs + 1] = tostring(err)
        end
    end
    return nil, "cluster map: " .. table.concat(errs, "; ")
end

-- The timer of a refresh.
local function refresh_timer(premature, rconf)
    if premature then
        return
    end
    local ok, err = _M.refresh(rconf)
    if not ok then
        ngx.log(ngx.WARN, "rl: ", err)
    end
end

--- Schedules a refresh unless one ran in the last refresh_ms on this
--- nginx node (the lock expires by itself: a refresh that fails is
--- retried by the next request that needs it).
function _M.schedule_refresh(rconf)
    local d, ns = dict_of(rconf)
    if d:add(ns .. ":lock", true, rconf.refresh_ms / 1000) then
        local ok, err = ngx.timer.at(0, refresh_timer, rconf)
        if not ok then
            ngx.log(ngx.WARN, "rl: cannot schedule the cluster map refresh: ", err)
        end
    end
end

-- One pipeline to `addr` with the commands `idx` of `cmds`; replies go to
-- `out` (an error reply for each when the node cannot be reached).
local function run_group(rconf, addr, idx, cmds, asking, out, deadline)
    local host, port = transport.addr(addr)
    local group, ask = {}, asking and {} or nil
    for j, i in ipairs(idx) do
        group[j] = cmds[i]
        if ask then
            ask[j] = asking[i]
        end
    end
    local red, err = transport.connect(rconf, host, port, deadline)
    local res
    if red then
        res, err = transport.send(red, group, ask)
    end
    if not res then
        for _, i in ipairs(idx) do
            out[i] = { false, "NODE " .. addr .. ": " .. tostring(err) }
        end
        return false, err
    end
    transport.keepalive(red, rconf)
    for j, i in ipairs(idx) do
        out[i] = res[j]
    end
    return true
end

-- Runs every group (addr -> list of command indexes), in parallel when
-- there are several. Returns true when at least one node answered.
local function run_groups(rconf, groups, cmds, asking, out, deadline)
    local list = {}
    for addr, idx in pairs(groups) do
        list[#list + 1] = { addr, idx }
    end
    local any, unreachable = false, false
    if #list == 1 then
        any = run_group(rconf, list[1][1], list[1][2], cmds, asking, out, deadline)
        unreachable = not any
    else
        local threads = {}
        for i, g in ipairs(list) do
            threads[i] = ngx.thread.spawn(run_group, rconf, g[1], g[2], cmds, asking, out, deadline)
        end
        for i = 1, #threads do
            local ok, answered = ngx.thread.wait(threads[i])
            any = any or (ok and answered)
            unreachable = unreachable or not (ok and answered)
        end
    end
    if unreachable then
        _M.schedule_refresh(rconf)
    end
    return any
end

--- Runs `cmds` on the cluster within `deadline` (see the file comment).
--- Returns one reply per command, or nil and an error when no node
--- answered at all.
function _M.run(rconf, cmds, deadline)
    local m = current(rconf)
    if not m then
        _M.schedule_refresh(rconf)
    end
    local groups = {}
    for i, c in ipairs(cmds) do
        local slot = _M.keyslot(tostring(transport.key_of(c) or ""))
        -- before the first map: a seed, whose MOVED names the owner
        local addr = m and m.owner[slot] or rconf.nodes[(slot % #rconf.nodes) + 1]
        groups[addr] = groups[addr] or {}
        table.insert(groups[addr], i)
    end
    local out = {}
    if not run_groups(rconf, groups, cmds, nil, out, deadline) then
        return nil, out[1] and out[1][2] or "cluster: no node answered"
    end
    local retry, asking, moved = {}, {}, false
    for i = 1, #cmds do
        local r = out[i]
        if type(r) == "table" and r[1] == false and type(r[2]) == "string" then
            local kind, addr = r[2]:match("^(%u+) %d+ (%S+)$")
            if kind == "MOVED" or kind == "ASK" then
                metrics.redirect(rconf, kind)
                moved = moved or kind == "MOVED"
                asking[i] = kind == "ASK"
                retry[addr] = retry[addr] or {}
                table.insert(retry[addr], i)
            end
        end
    end
    if moved then
        _M.schedule_refresh(rconf)
    end
    if next(retry) then
        -- once: a second redirection stays an error reply
        run_groups(rconf, retry, cmds, asking, out, deadline)
    end
    return out
end

return _M
