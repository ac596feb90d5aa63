-- resty.rl.allowance: local allowances of a bucket rule (`allowance` of a
-- rule; gateway/README.md, "Local allowances"). A node takes up to `size`
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

local store = require "resty.rl.store"
local metrics = require "resty.rl.metrics"

local _M = {}

-- Tries to drain a busy key this many times per sweep.
local DRAIN_ATTEMPTS = 5
-- Seconds a fetch in flight keeps the others of its node from fetching
-- (its reply ends it sooner; a fetch that got no reply lets it expire).
local FETCH_LOCK_TTL = 1
-- The shortest interval between sweeps (seconds).
local MIN_SWEEP = 0.1

--- Validates and completes `r.allowance` of rule `r` (limiter `l`) at
--- start; `check(cond, fmt, ...)` raises the configuration error.
function _M.validate(where, r, l, check)
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
end

--- Spends the cost of entry `e` from the node's allowance: true (and the
--- points left) when it was there, nil when it was not (fetch one).
function _M.spend(e)
    local d = ngx.shared[e.rule.allowance.dict]
    local k = "a:" .. e.key
    local left = d:incr(k, -e.cost)
    if left and left >= 0 then
        return true, left
    end
    if left then
        d:incr(k, e.cost)
    end
    return nil
end

--- The outcome of a request admitted from the node's allowance: the
--- binding shows the bucket as last seen in Redis plus what the node
--- still holds (an estimate: other nodes spend too).
function _M.local_outcome(e, left)
    local p = e.params
    local d = ngx.shared[e.rule.allowance.dict]
    local remaining = math.min((d:get("g:" .. e.key) or 0) + left, p.burst)
    return { state = "allowed", allowance = true,
             binding = { name = e.name, limit = p.burst, remaining = remaining,
                         reset_ms = math.ceil((p.burst - remaining) * p.period * 1000 / p.rate),
                         window = p.period, unit = e.rule.unit } }
end

--- The request's cost of `e` spent from the node's allowance: true (the
--- outcome set, no Redis call), else false, with `e.fetch` set when this
--- request fetches the node's next allowance (its command is then
--- resty.rl.allowance.command; else the rule's usual command).
function _M.spent(conf, e)
    _M.ensure_sweeper(conf, e)
    local ok, left = _M.spend(e)
    if ok then
        e.outcome = _M.local_outcome(e, left)
        return true
    end
    -- one fetch per key and node at a time: the requests that miss meanwhile
    -- pay their own cost in Redis (as without allowance), so that the node
    -- holds about one allowance, not one per concurrent request
    e.fetch = ngx.shared[e.rule.allowance.dict]:add("f:" .. e.key, true, FETCH_LOCK_TTL)
    return false
end

--- The command fetching an allowance for `e` (its own cost included).
function _M.command(e)
    local p = e.params
    return { "RL.TAKE", e.key, p.burst, p.rate, p.period,
             "COST", math.max(e.rule.allowance.size, e.cost), "PARTIAL", "MIN", e.cost }
end

--- The reply to the fetch of `e` (9 integers): keeps what this request
--- does not spend in the node's allowance. Returns the first 8 integers
--- (the usual reply) for the outcome, or `raw` when it is not a reply.
function _M.keep(e, raw)
    local a = e.rule.allowance
    local d = ngx.shared[a.dict]
    d:delete("f:" .. e.key)
    if type(raw) ~= "table" or #raw ~= 9 or type(raw[9]) ~= "number" then
        return raw
    end
    local granted = raw[9]
    local out = { raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8] }
    if raw[1] == 1 and granted > e.cost then
        local p = e.params
        d:set("p:" .. e.key, table.concat({ p.burst, p.rate, p.period, a.max_age }, " "))
        d:set("g:" .. e.key, raw[3])
        d:add("b:" .. e.key, ngx.now())
        local left = d:incr("a:" .. e.key, granted - e.cost, 0)
        -- the header shows the node's points too
        out[3] = raw[3] + (left or 0)
    end
    return out
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

-- One sweep of dict `d`: allowances older than their max age (every one
-- when `all`) go back to Redis.
local function sweep(conf, d, all)
    local now = ngx.now()
    local cmds, back = {}, {}
    local mine = conf.key_prefix .. ":"
    for _, name in ipairs(d:get_keys(0)) do
        local key = name:match("^a:(.*)$")
        -- the keys of this configuration's Redis (its key prefix)
        if key and key:sub(1, #mine) == mine then
            local p = d:get("p:" .. key)
            local burst, rate, period, max_age = (p or ""):match("^(%S+) (%S+) (%S+) (%S+)$")
            local born = d:get("b:" .. key)
            if not born then
                -- points added after a drain deleted the time: they age from now
                d:add("b:" .. key, now)
            elseif burst and (all or now - born >= tonumber(max_age)) then
                d:delete("b:" .. key)
                local n = drain(d, name)
                if n > 0 then
                    cmds[#cmds + 1] = { "RL.TAKE", key, burst, rate, period, "REFUND", n }
                    back[#back + 1] = { name, n }
                end
            end
        end
    end
    if #cmds == 0 then
        return
    end
    local res, err = store.pipeline_ok(conf, cmds)
    if not res then
        metrics.redis_error(conf, err)
        ngx.log(ngx.WARN, "rl: allowances not returned: ", tostring(err))
        if not all then
            -- kept for the next sweep (at exit they come back with the refill)
            for _, b in ipairs(back) do
                d:incr(b[1], b[2], 0)
            end
        end
    end
end

local sweepers = {}
-- The rules' allowance tables whose sweeper runs (the per-request check).
local swept = setmetatable({}, { __mode = "k" })

--- Starts this worker's sweeper of the allowances of `conf` (once per
--- worker, dict and key prefix; every worker sweeps the shared dict, each drain is
--- atomic). The timer's last run, when the worker exits, returns every
--- allowance.
function _M.ensure_sweeper(conf, e)
    local a = e.rule.allowance
    if swept[a] then
        return
    end
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
