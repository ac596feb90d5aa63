-- resty.rl.limit.allowance: local allowances of a bucket rule (`allowance` of a
-- rule; gateway/REFERENCE.md, "Local allowances"). A node takes up to `size`
-- points at once from the rule's bucket in Redis (`RL.TAKE ... COST size
-- PARTIAL MIN cost`), spends them from a shared dict of the node (every
-- worker: `ngx.shared.DICT:incr`, atomic), and gives back what is left
-- with `RL.TAKE ... REFUND left` once the allowance is `max_age` seconds
-- old, or when the worker exits (a graceful stop or a reload).
--
-- The global bound stays exact: a point is admitted at most once, from
-- Redis or from one node's allowance, and the module grants at most what
-- the bucket holds. What it trades: a node may hold points another node
-- could have used, for at most `max_age` (plus one sweep).
--
-- Dict entries, per rule key K: "a:" .. K the points left (>= 0 once every
-- concurrent spend has settled), "b:" .. K when the allowance was taken
-- (ngx.now()), "p:" .. K the bucket's "burst rate period max_age" (what a
-- refund needs, written by the worker that fetched), "g:" .. K what Redis
-- said was left at the last fetch, "f:" .. K a fetch in flight.
--
-- Every spend or drain is an incr: a decrement that leaves the count
-- negative is undone by the party that made it, so the points taken out
-- never exceed the points put in.
--
-- With `home` (a region's allowance, leased from the home region's
-- bucket): every fetch and refund goes to the home's Redis, only ever in a
-- timer, and a request never waits for it: a node that holds nothing
-- starts a fetch and refuses the request (429). A fetch without a reply
-- marks the home unreachable ("u:" .. K); the node then admits up to
-- `borrow` points on its own ("o:" .. K, the points borrowed), and the
-- first fetch after the home answered again sends `RL.TAKE ... COST
-- borrowed DEBT` in front of it, in the same round trip. The count is
-- taken out of the dict before the charge is sent and put back only when
-- no reply came: a reply lost after the home applied the charge charges it
-- again (more charged, never more admitted); a worker that dies between
-- taking the count and sending loses it (at most `borrow` points).

local commands = require "resty.rl.redis.commands"
local metrics = require "resty.rl.observe.metrics"

local _M = {}

-- The Redis fields `allowance.home` may set (the policy's redis table's).
local HOME_FIELDS = { host = true, port = true, password = true, database = true,
    timeout_ms = true, pool_size = true, keepalive_ms = true, mode = true, nodes = true,
    sentinels = true, master_name = true, sentinel_password = true, dict = true,
    refresh_ms = true }
-- The home regions' configurations by id (written at start, the same in
-- every worker): what a sweep sends the refunds to.
local homes = {}

-- Tries to drain a busy key this many times per sweep.
local DRAIN_ATTEMPTS = 5
-- Seconds a fetch in flight keeps the others of its node from fetching
-- (its reply ends it sooner; a fetch that got no reply lets it expire).
local FETCH_LOCK_TTL = 1
-- The shortest interval between sweeps (seconds).
local MIN_SWEEP = 0.1

-- Validates `a.home` (rule `where`) and completes it into `a.home_conf`
-- (configuration `conf` with the home's redis table) and `a.home_id`.
local function validate_home(where, a, check, conf)
    check(type(a.home) == "table", "%s: allowance.home must be a table of redis fields "
        .. "(host, port, mode, nodes, ...)", where)
    local h = {}
    for k, v in pairs(conf.redis) do
        h[k] = v
    end
    if a.home.host or a.home.port then
        -- an address of its own: a single server unless it says otherwise
        h.mode, h.nodes, h.sentinels = "single", nil, nil
    end
    for k, v in pairs(a.home) do
        check(HOME_FIELDS[k], "%s: allowance.home.%s is not a redis field", where, tostring(k))
        h[k] = v
    end
    check(type(h.host) == "string" and type(h.port) == "number" and h.port >= 1
        and h.port <= 65535 and h.port % 1 == 0,
        "%s: allowance.home.host must be a string and allowance.home.port a port", where)
    check(type(h.timeout_ms) == "number" and h.timeout_ms > 0,
        "%s: allowance.home.timeout_ms must be > 0", where)
    local id
    if h.mode == "single" then
        id = h.host .. ":" .. h.port
    elseif h.mode == "cluster" then
        h.nodes = h.nodes or { h.host .. ":" .. h.port }
        check(type(h.nodes) == "table" and #h.nodes > 0 and type(h.dict) == "string"
            and ngx.shared[h.dict] ~= nil and (conf.redis.mode ~= "cluster"
            or h.dict ~= conf.redis.dict), "%s: allowance.home in cluster mode needs nodes and "
            .. "a dict of its own (allowance.home.dict, a lua_shared_dict)", where)
        id = table.concat(h.nodes, ",")
    elseif h.mode == "sentinel" then
        check(type(h.sentinels) == "table" and #h.sentinels > 0 and type(h.master_name) == "string",
            "%s: allowance.home in sentinel mode needs sentinels and master_name", where)
        id = table.concat(h.sentinels, ",") .. "/" .. h.master_name
    else
        check(false, "%s: allowance.home.mode must be single, cluster or sentinel", where)
    end
    h.metrics_dict = conf.metrics_dict
    a.home_id = h.mode .. "/" .. id
    a.home_conf = setmetatable({ redis = h }, { __index = conf })
    homes[a.home_id] = a.home_conf
end

--- Validates and completes `r.allowance` of rule `r` (limiter `l`) at
--- start (`conf`: the policy); `check(cond, fmt, ...)` raises the
--- configuration error.
function _M.validate(where, r, l, check, conf)
    local a = r.allowance
    if a == nil then
        return
    end
    check(type(a) == "table", "%s: allowance must be a table", where)
    check(l.kind == "bucket" and not l.also and not l.strikes and not l.delay and not l.jitter,
        "%s: allowance needs a bucket limiter without also, strikes, delay or jitter", where)
    check(r.count == nil or r.count == "requests", "%s: allowance needs count = requests", where)
    check(type(a.size) == "number" and a.size >= 1 and a.size % 1 == 0,
        "%s: allowance.size must be an integer >= 1", where)
    a.max_age = a.max_age or 1
    check(type(a.max_age) == "number" and a.max_age > 0 and a.max_age <= 3600,
        "%s: allowance.max_age must be seconds > 0 (at most 3600)", where)
    a.dict = a.dict or "rl_allowance"
    check(ngx.shared[a.dict] ~= nil, "%s: lua_shared_dict %s (the allowances of the node) is "
        .. "not declared", where, a.dict)
    if type(r.cost) == "number" then
        check(a.size >= r.cost, "%s: allowance.size must be at least the cost %d", where, r.cost)
    end
    a.borrow = a.borrow or 0
    check(type(a.borrow) == "number" and a.borrow >= 0 and a.borrow % 1 == 0,
        "%s: allowance.borrow must be an integer >= 0 (points)", where)
    if a.home == nil then
        check(a.borrow == 0, "%s: allowance.borrow needs allowance.home", where)
        a.refill_below = a.refill_below or 0
    else
        validate_home(where, a, check, conf)
        -- a region's node never fetches in a request: ahead of need by default
        a.refill_below = a.refill_below or math.floor(a.size / 2)
    end
    check(type(a.refill_below) == "number" and a.refill_below >= 0 and a.refill_below % 1 == 0
        and a.refill_below < a.size, "%s: allowance.refill_below must be an integer >= 0, "
        .. "below size", where)
end

-- The dict entries' names of a rule key (see the file comment), made once
-- per key (a per-worker memo of the hot keys; it starts over past
-- MAX_NAMES keys).
local MAX_NAMES = 10000
local names, n_names = {}, 0
local function names_of(key)
    local n = names[key]
    if not n then
        n = { a = "a:" .. key, g = "g:" .. key, f = "f:" .. key, b = "b:" .. key, p = "p:" .. key,
              u = "u:" .. key, o = "o:" .. key }
        if n_names >= MAX_NAMES then
            names, n_names = {}, 0
        end
        names[key], n_names = n, n_names + 1
    end
    return n
end

--- Spends the cost of entry `e` from the node's allowance: true (and the
--- points left) when it was there, nil when it was not (fetch one).
function _M.spend(e)
    local d = ngx.shared[e.rule.allowance.dict]
    local k = names_of(e.key).a
    local left = d:incr(k, -e.cost)
    if left and left >= 0 then
        return true, left
    end
    if left then
        d:incr(k, e.cost)
    end
    return nil
end

-- What the bucket had left in Redis at the node's last fetch for `e`,
-- read from the dict at most every SEEN_TTL seconds per worker (the
-- names' record keeps it).
local SEEN_TTL = 0.1
local function last_seen(d, e)
    local n, now = names_of(e.key), ngx.now()
    if not n.seen_until or now >= n.seen_until then
        n.seen, n.seen_until = d:get(n.g) or 0, now + SEEN_TTL
    end
    return n.seen
end

--- The outcome of a request admitted from the node's allowance: the
--- binding shows the bucket as last seen in Redis (by this worker, at most
--- 0.1 s ago) plus what the node still holds (an estimate: other nodes
--- spend too).
function _M.local_outcome(e, left)
    local p = e.params
    local d = ngx.shared[e.rule.allowance.dict]
    local remaining = math.min(last_seen(d, e) + left, p.burst)
    -- its own binding: one table (of 8 fields) per request served from
    -- the allowance
    local o = { state = "allowed", binding = false,
                name = e.name, limit = p.burst, remaining = remaining,
                reset_ms = math.ceil((p.burst - remaining) * p.period * 1000 / p.rate),
                window = p.period, unit = e.rule.unit }
    o.binding = o
    return o
end

-- Points granted to the node for `e` (`left`: what the bucket in Redis
-- has left after the grant): kept in the node's allowance. Returns the
-- points the node now holds.
local function hold(d, e, points, left)
    local a, p, n = e.rule.allowance, e.params, names_of(e.key)
    d:set(n.p, table.concat({ p.burst, p.rate, p.period, a.max_age, a.home_id or "-" }, " "))
    d:set(n.g, left)
    n.seen_until = nil
    d:add(n.b, ngx.now())
    return d:incr(n.a, points, 0)
end

-- Takes every point of dict key `k` out (none when concurrent spends keep
-- it busy): the points taken.
local function drain(d, k)
    for _ = 1, DRAIN_ATTEMPTS do
        local v = d:get(k)
        if type(v) ~= "number" or v <= 0 then
            return 0
        end
        local left = d:incr(k, -v)
        if left and left >= 0 then
            return v
        end
        if left then
            d:incr(k, v)
        end
    end
    return 0
end

--- The fetch of `e`'s next allowance (at least 1 point; `d`: the dict)
--- and, with a home not marked unreachable, the charge of the points
--- borrowed in front of it (taken out of the dict): the commands, and the
--- points charged.
function _M.fetch_commands(d, e)
    local a, p, n = e.rule.allowance, e.params, names_of(e.key)
    local cmds, owed = {}, 0
    if a.home and not d:get(n.u) then
        owed = drain(d, n.o)
        if owed > 0 then
            cmds[1] = { "RL.TAKE", e.key, p.burst, p.rate, p.period, "COST", owed, "DEBT" }
        end
    end
    cmds[#cmds + 1] = { "RL.TAKE", e.key, p.burst, p.rate, p.period,
        "COST", a.size, "PARTIAL", "MIN", 1 }
    return cmds, owed
end

-- A fetch ahead (a timer: refill_below, or a region's node that holds
-- nothing): the next allowance of `e`, kept for the node's next requests.
-- With a home: a fetch without a reply marks the home unreachable, one
-- with a reply clears the mark.
local function fetch_ahead(premature, conf, e)
    local a = e.rule.allowance
    local d, n = ngx.shared[a.dict], names_of(e.key)
    if not premature then
        local cmds, owed = _M.fetch_commands(d, e)
        local res, err = commands.pipeline(a.home_conf or conf, cmds)
        local r = res and res[#cmds]
        if owed > 0 and not (res and type(res[1]) == "table" and res[1][1] == 1) then
            -- not charged (no reply: perhaps charged, see the file comment)
            d:incr(n.o, owed, 0)
        end
        if a.home then
            if res then
                d:delete(n.u)
            else
                d:set(n.u, true)
            end
        end
        if type(r) == "table" and r[1] == 1 and type(r[9]) == "number" and r[9] > 0 then
            hold(d, e, r[9], r[3])
        elseif not res then
            metrics.redis_error(conf, err)
        elseif type(r) == "table" and r[1] == false then
            -- an error reply
            metrics.redis_error(conf, r[2])
        end
    end
    d:delete(n.f)
end

-- Starts the fetch ahead of `e` unless one is in flight on the node.
local function start_fetch(conf, e)
    local d, f = ngx.shared[e.rule.allowance.dict], names_of(e.key).f
    if d:add(f, true, FETCH_LOCK_TTL) then
        local started, err = ngx.timer.at(0, fetch_ahead, conf, e)
        if not started then
            d:delete(f)
            ngx.log(ngx.WARN, "rl: cannot fetch the next allowance ahead: ", tostring(err))
        end
    end
end

-- A region's node that holds nothing for `e` (allowance.home): borrows
-- the cost while the home is unreachable (within `borrow`), else refuses
-- (429, Retry-After 1 s) while its fetch is in flight. Decided here: no
-- Redis call in the request.
local function without_points(conf, e)
    local a = e.rule.allowance
    local d, n = ngx.shared[a.dict], names_of(e.key)
    start_fetch(conf, e)
    if a.borrow > 0 and d:get(n.u) then
        local used = d:incr(n.o, e.cost, 0)
        if used and used <= a.borrow then
            e.outcome = _M.local_outcome(e, 0)
            return true
        end
        if used then
            d:incr(n.o, -e.cost)
        end
    end
    local p = e.params
    e.outcome = { state = "refused", retry_ms = 1000, binding = { name = e.name,
        limit = p.burst, remaining = 0, unit = e.rule.unit, window = p.period } }
    return true
end

--- The request's cost of `e` spent from the node's allowance: true (the
--- outcome set, no Redis call), else false, with `e.fetch` set when this
--- request fetches the node's next allowance (its command is then
--- resty.rl.limit.allowance.command; else the rule's usual command). With
--- `refill_below`, a spend that leaves fewer points starts a fetch ahead
--- (one timer, no wait). With `home`, always true (without_points).
function _M.spent(conf, e)
    _M.ensure_sweeper(conf, e)
    local ok, left = _M.spend(e)
    local a = e.rule.allowance
    if ok then
        e.outcome = _M.local_outcome(e, left)
        if left < a.refill_below then
            start_fetch(conf, e)
        end
        return true
    end
    if a.home then
        return without_points(conf, e)
    end
    -- one fetch per key and node at a time: the requests that miss meanwhile
    -- pay their own cost in Redis (as without allowance), so that the node
    -- holds about one allowance, not one per concurrent request
    e.fetch = ngx.shared[a.dict]:add(names_of(e.key).f, true, FETCH_LOCK_TTL)
    return false
end

--- The command fetching an allowance for `e` (its own cost included),
--- with the integers of its reply (`ints`: the usual 8 and the points
--- granted; resty.rl.redis.client.send).
function _M.command(e)
    local p = e.params
    return { "RL.TAKE", e.key, p.burst, p.rate, p.period,
             "COST", math.max(e.rule.allowance.size, e.cost), "PARTIAL", "MIN", e.cost,
             ints = 9 }
end

--- The reply to the fetch of `e` (9 integers): keeps what this request
--- does not spend in the node's allowance. Returns the first 8 integers
--- (the usual reply) for the outcome, or `raw` when it is not a reply.
function _M.keep(e, raw)
    local d = ngx.shared[e.rule.allowance.dict]
    d:delete(names_of(e.key).f)
    if type(raw) ~= "table" or #raw ~= 9 or type(raw[9]) ~= "number" then
        return raw
    end
    local granted = raw[9]
    local out = { raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8] }
    if raw[1] == 1 and granted > e.cost then
        local left = hold(d, e, granted - e.cost, raw[3])
        -- the header shows the node's points too
        out[3] = raw[3] + (left or 0)
    end
    return out
end

-- Sends the refunds `cmds` (the dict entries drained: `back`) to `target`;
-- when no reply came, puts them back for the next sweep unless `all` (at
-- exit: they come back with the bucket's refill).
local function refund(target, cmds, back, d, all)
    local res, err = commands.pipeline_ok(target, cmds)
    if not res then
        metrics.redis_error(target, err)
        ngx.log(ngx.WARN, "rl: allowances not returned: ", tostring(err))
        if not all then
            for _, b in ipairs(back) do
                d:incr(b[1], b[2], 0)
            end
        end
    end
end

-- One sweep of dict `d`: allowances older than their max age (every one
-- when `all`) go back to Redis (a region's to its home).
local function sweep(conf, d, all)
    local now = ngx.now()
    local by_target = {}
    local mine = conf.key_prefix .. ":"
    for _, name in ipairs(d:get_keys(0)) do
        local key = name:match("^a:(.*)$")
        -- the keys of this configuration's Redis (its key prefix)
        if key and key:sub(1, #mine) == mine then
            local p = d:get("p:" .. key)
            local burst, rate, period, max_age, home =
                (p or ""):match("^(%S+) (%S+) (%S+) (%S+) (%S+)$")
            local born = d:get("b:" .. key)
            local target = home == "-" and conf or homes[home or ""]
            if not born then
                -- points added after a drain deleted the time: they age from now
                d:add("b:" .. key, now)
            elseif target and (all or now - born >= tonumber(max_age)) then
                d:delete("b:" .. key)
                local n = drain(d, name)
                if n > 0 then
                    local t = by_target[target] or { cmds = {}, back = {} }
                    by_target[target] = t
                    t.cmds[#t.cmds + 1] = { "RL.TAKE", key, burst, rate, period, "REFUND", n }
                    t.back[#t.back + 1] = { name, n }
                end
            end
        end
    end
    for target, t in pairs(by_target) do
        refund(target, t.cmds, t.back, d, all)
    end
end

local sweepers = {}
local start_sweeper
-- The rules' allowance tables whose sweeper runs (the per-request check).
local swept = setmetatable({}, { __mode = "k" })

--- Starts this worker's sweeper of the allowances of `conf` (once per
--- worker, dict and key prefix; every worker sweeps the shared dict, each drain is
--- atomic). The timer's last run, when the worker exits, returns every
--- allowance.
function _M.ensure_sweeper(conf, e)
    local a = e.rule.allowance
    if not swept[a] then
        start_sweeper(conf, a)
    end
end

-- Starts the sweeper of allowance `a` (see ensure_sweeper; apart from
-- it, whose check runs on every request: its closure would keep LuaJIT
-- from compiling that check).
function start_sweeper(conf, a)
    local id = a.dict .. " " .. conf.key_prefix
    swept[a] = true
    if sweepers[id] then
        return
    end
    sweepers[id] = true
    local d = ngx.shared[a.dict]
    -- often enough for the youngest max age of the rules on this dict
    local youngest = a.max_age
    for _, r in ipairs(conf.rules) do
        if r.allowance and r.allowance.dict == a.dict then
            youngest = math.min(youngest, r.allowance.max_age)
        end
    end
    local ok, err = ngx.timer.every(math.max(youngest / 2, MIN_SWEEP), function(premature)
        local done, serr = pcall(sweep, conf, d, premature or ngx.worker.exiting())
        if not done then
            ngx.log(ngx.ERR, "rl: allowance sweep failed: ", tostring(serr))
        end
    end)
    if not ok then
        sweepers[id], swept[a] = nil, nil
        ngx.log(ngx.WARN, "rl: cannot start the allowance sweeper: ", tostring(err))
    end
end

return _M
