-- resty.rl.limit.limiters: per limiter kind of a rule policy, the module command
-- it sends, the RateLimit-Policy items it lists and how its reply becomes
-- an outcome. The extension point for a new kind: one entry in KINDS
-- here, with command, policies and outcome (in a module of its own, as
-- "distinct members", resty.rl.limit.distinct), and its option validation in
-- resty.rl.policy.rules (KINDS).
--
-- A kind's command(e, cost, record, request_id, refund): the command
-- charging `cost` (record: a failure recorded after the response, with
-- its strikes), or with `refund` the one giving `cost` points back to
-- every bucket of the rule (`REFUND`, no penalty options): the
-- compensation of a request another rule refused. A lease has no refund
-- (it is released).
--
-- A kind's reply_ints: the integers of its command's reply when that is
-- an array of integers (a command sent alone is then read in one piece,
-- resty.rl.redis.client.send); nil for another shape.
--
-- An entry `e` (built by resty.rl.decide.engine for one rule and one request):
--   e.rule, e.params (the limiter's options resolved for the caller),
--   e.key, e.also_keys, e.cost, e.name and e.also_names (policy names),
--   e.probe (count = failures: probe now, charge after the response),
--   e.day_key (a WEEK or MONTH quota's counter of today, or false).
-- An outcome: {state = "allowed" | "delayed" | "refused" | "boxed",
--   retry_ms (nil: no time to come back), level, strikes, binding =
--   {name, limit, remaining, reset_ms, window}}.

local commands = require "resty.rl.redis.commands"
local metrics = require "resty.rl.observe.metrics"
local memo = require "resty.rl.base.memo"
local distinct = require "resty.rl.limit.distinct"
local hotpath = require "resty.rl.base.hotpath"

local _M = {}

--- The limit of a per-day counter: the module's largest, so that it never
--- refuses nor binds (the quota's own key always has fewer points left);
--- a string: a Lua number this large would be sent as "1e+15".
_M.DAY_LIMIT = "1000000000000000"

--- The per-day counter of quota key `key` for UTC date `date`
--- (YYYY-MM-DD): the key with a suffix (the same hash slot).
function _M.day_key(key, date)
    return key .. ":day=" .. date
end

local DAY_LIMIT = _M.DAY_LIMIT

local MONTH_DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

--- Seconds of the current calendar period (UTC): DAY, WEEK or MONTH.
function _M.period_seconds(period)
    if period == "DAY" then
        return 86400
    elseif period == "WEEK" then
        return 7 * 86400
    end
    local d = os.date("!*t", ngx.time())
    local days = MONTH_DAYS[d.month]
    if d.month == 2 and (d.year % 4 == 0 and (d.year % 100 ~= 0 or d.year % 400 == 0)) then
        days = 29
    end
    return days * 86400
end

-- The penalty options of a rate command (strikes, box, offenses, jitter).
-- A rule with `strikes.every_refusal` (block on exceeding: the velocity
-- design's "5 a minute, then blocked 5 minutes") sends EVERY: each of its
-- refusals is a strike, the first one included.
local function penalty(args, p, probe)
    if p.strikes and not probe then
        args[#args + 1] = "STRIKES"
        args[#args + 1] = p.strikes.threshold
        args[#args + 1] = p.strikes.window
        if p.strikes.every_refusal then
            args[#args + 1] = "EVERY"
        end
        if p.box then
            args[#args + 1] = "BOX"
            for i = 1, 3 do
                args[#args + 1] = p.box[i]
            end
        end
        if p.offenses_ttl then
            args[#args + 1] = "OFFENSES"
            args[#args + 1] = p.offenses_ttl
        end
    end
    if p.jitter and p.jitter > 0 and not probe then
        args[#args + 1] = "JITTER"
        args[#args + 1] = p.jitter
    end
    return args
end

-- The RESERVE clauses of a bucket command: `reserve` percent of the first
-- bucket (index 0) and of each `also` bucket (index i) kept for others
-- (the priority tiers: a fleet bucket that Free calls leave half full).
local function add_reserve(args, index, percent)
    if percent and percent > 0 then
        local n = #args
        args[n + 1], args[n + 2], args[n + 3] = "RESERVE", index, percent
    end
end
local function reserves(args, p)
    add_reserve(args, 0, p.reserve)
    for i, a in ipairs(p.also or {}) do
        add_reserve(args, i, a.reserve)
    end
end

-- The "window" (w) of a bucket, window or quota for the headers.
local function window_of(kind, p)
    if kind == "bucket" then
        return p.period
    elseif kind == "window" then
        return p.window
    end
    return _M.period_seconds(p.period)
end

-- The error of a reply that is not the expected one (an error reply of a
-- pipelined or scripted command comes back as {false, "ERR ..."}).
local function bad_reply(raw)
    return "unexpected reply: " .. tostring(type(raw) == "table" and raw[2] or raw)
end

-- A rate outcome from an 8-integer reply (resty.rl.redis.commands.decode's
-- fields, read from the reply itself: no decoded table per request); its
-- own binding, as resty.rl.limit.allowance's: one table (of at most 16 fields)
-- per entry and request.
-- Rate outcomes given back after their request (give_back), reused by
-- the next ones (as resty.rl.decide.matching's entries). At most 64.
local take_outcome, give_outcome = hotpath.pool(64)

local function new_outcome()
    return take_outcome()
        or { state = false, strikes = false, level = false, retry_ms = false, binding = false,
             name = false, limit = false, remaining = false, reset_ms = false, window = false,
             unit = false, clamp = false, boxed = false }
end

--- Gives back outcome `o` of a request done with it (resty.rl.decide.matching
--- .release) when it is a rate outcome without a box (one made here
--- with no field beyond its own).
function _M.give_back(o)
    if o and o.binding == o and not o.boxed then
        give_outcome(o)
    end
end

local function rate_outcome(e, raw)
    if not commands.is_rate_reply(raw) then
        return nil, bad_reply(raw)
    end
    local kind, none = e.params.kind, commands.none
    local status, remaining, reset_ms, b = raw[1], raw[3], none(raw[4]), raw[8]
    local bp = b == 0 and e.params or e.params.also[b]
    local out = new_outcome()
    out.state = status == 1 and "allowed" or status == 2 and "delayed"
        or status == 0 and "refused" or "boxed"
    out.strikes, out.level, out.retry_ms, out.binding = none(raw[7]), raw[6], nil, out
    out.name, out.limit = b == 0 and e.name or e.also_names[b], raw[2]
    out.remaining, out.reset_ms, out.window = remaining, reset_ms, window_of(kind, bp)
    out.unit, out.clamp = e.rule.unit, kind ~= "bucket"
    if status == 1 then
        if e.probe and remaining < e.cost then
            -- count = failures: no failure left; the window frees at the latest by its reset
            out.state, out.retry_ms = "refused", math.min(reset_ms or 0, out.window * 1000)
        end
    else
        out.retry_ms = none(raw[5])
        if out.state == "boxed" then
            out.remaining, out.boxed = 0, true
        end
    end
    return out
end

-- The rate policies (RateLimit-Policy items) of an entry.
local function rate_policies(e)
    local kind, p = e.params.kind, e.params
    local items = { { name = e.name, quota = p.rate or p.limit, window = window_of(kind, p),
                      unit = e.rule.unit } }
    for i, a in ipairs(p.also or {}) do
        items[#items + 1] = { name = e.also_names[i], quota = a.rate or a.limit,
                              window = window_of(kind, a), unit = e.rule.unit }
    end
    return items
end

-- Appends the ALSO clauses of an entry, each with `fields` of its options.
local function also(args, e, fields)
    for i, a in ipairs(e.params.also or {}) do
        args[#args + 1] = "ALSO"
        args[#args + 1] = e.also_keys[i]
        for _, f in ipairs(fields) do
            args[#args + 1] = a[f]
        end
    end
    return args
end

-- The options a kind's command names, in order, for its key and each ALSO key.
local BUCKET_FIELDS = { "burst", "rate", "period" }
local WINDOW_FIELDS = { "limit", "window" }
local QUOTA_FIELDS = { "limit", "period" }

-- `name key <fields> COST|REFUND cost [ALSO key <fields>]...` of entry `e`.
local function rate_args(name, e, fields, cost, refund)
    local p = e.params
    local args = { name, e.key }
    for _, f in ipairs(fields) do
        args[#args + 1] = p[f]
    end
    args[#args + 1] = refund and "REFUND" or "COST"
    args[#args + 1] = cost
    return also(args, e, fields)
end

-- The commands of entries whose command their rule's key and cost say
-- all of (a static limiter without ALSO, a cost from the configuration),
-- by rule, key and cost: made and encoded once (resty.rl.redis.commands.encoded),
-- as the tier form's are. Bounded: past the memo's size it starts over.
local static_cmds = memo.new(10000, true)
local function new_by_cost()
    return {}
end

--- The command of entry `e` (not a lease: it names the request) charging
--- `cost`, with the integers of its reply (`ints`: alone, it is read in
--- one piece). Shared by the requests of the same key when the rule's
--- key and cost say all of it: never changed by its users; such a
--- command's `alone` is the one-command list that sends it alone.
function _M.command_of(e, cost)
    local kind = _M.KINDS[e.params.kind]
    -- (ALSO keys are known from the main key only when both come from one
    -- memo of a key template: e.keys_id)
    local also_known = not e.params.also or (e.keys_id and not e.day_key)
    if not (e.static and kind.reply_ints and also_known and type(e.rule.cost) ~= "table") then
        local cmd = kind.command(e, cost, false, nil)
        cmd.ints = kind.reply_ints
        return cmd
    end
    -- (a quota's command names today's counter: one memo per key and day;
    -- by limiter: a rule's limiter resolved per tier is one table per tier)
    local id = e.keys_id or e.day_key or e.key
    local by_cost = static_cmds:peek(e.params, id) or static_cmds:get(e.params, id, new_by_cost)
    local cmd = by_cost[cost]
    if not cmd then
        cmd = commands.encoded(kind.command(e, cost, false, nil), kind.reply_ints)
        -- the list of a request that sends it alone (shared too)
        cmd.alone = { cmd }
        by_cost[cost] = cmd
    end
    return cmd
end

--- The capacity every bucket of an entry has (a cost above it never fits).
function _M.capacity(e)
    local p = e.params
    local cap, also = p.burst or p.limit, p.also
    if not also then
        return cap
    end
    local one = hotpath.single(also)
    if one then
        -- one ALSO bucket (a tenant's): without a loop (resty.rl.base.hotpath)
        return math.min(cap, one.burst or one.limit)
    end
    for _, a in ipairs(also) do
        cap = math.min(cap, a.burst or a.limit)
    end
    return cap
end

--- The Retry-After (ms) of a full lease: the earliest holder's expected
--- end, `expected` seconds (default 1) after it started (the lease that
--- expires first was taken first: it started `ttl - earliest_left` ago),
--- at least 1 s, at most the earliest expiry; never the ttl itself.
function _M.lease_retry_ms(ttl, expected, earliest_left)
    local elapsed = ttl * 1000 - earliest_left
    local retry = (expected or 1) * 1000 - elapsed
    if retry < 1000 then
        retry = 1000
    end
    return math.min(retry, math.max(earliest_left, 1000))
end

-- A kind that counts (bucket, window, quota): its command builder, the
-- rate policies and outcome, an 8-integer reply.
local function rate_kind(command)
    return { command = command, policies = rate_policies, outcome = rate_outcome, reply_ints = 8 }
end

_M.KINDS = {
    bucket = rate_kind(function(e, cost, _record, _request_id, refund)
        local p = e.params
        local args = rate_args("RL.TAKE", e, BUCKET_FIELDS, cost, refund)
        if refund then
            return args
        end
        penalty(args, p, e.probe)
        reserves(args, p)
        if p.delay then
            args[#args + 1] = "DELAY"
            args[#args + 1] = p.delay
        end
        return args
    end),
    window = rate_kind(function(e, cost, record, _request_id, refund)
        local p = e.params
        local args = rate_args("RL.WINDOW", e, WINDOW_FIELDS, cost, refund)
        if p.mode == "exact" then
            args[#args + 1] = "EXACT"
        elseif p.mode == "fixed" then
            args[#args + 1] = "FIXED"
        end
        if refund then
            return args
        end
        return penalty(args, p, e.probe and not record)
    end),
    quota = rate_kind(function(e, cost, _record, _request_id, refund)
        local p = e.params
        local args = rate_args("RL.QUOTA", e, QUOTA_FIELDS, cost, refund)
        if e.day_key then
            -- today's points (resty.rl.limit.limiters.day_key): never binding
            local n = #args
            args[n + 1], args[n + 2], args[n + 3], args[n + 4] = "ALSO", e.day_key,
                DAY_LIMIT, p.period
        end
        if p.region then
            -- every key of the call counts on this region's component
            args[#args + 1] = "REGION"
        end
        if refund then
            return args
        end
        return penalty(args, p, e.probe)
    end),
    lease = {
        command = function(e, _cost, _record, request_id)
            return { "RL.LEASE", "ACQUIRE", e.key, e.params.max, e.params.ttl, "ID", request_id }
        end,
        policies = function(e)
            return { { name = e.name, quota = e.params.max, unit = "concurrent-requests" } }
        end,
        -- A full lease: Retry-After from the declared expected duration
        -- (`expected`, default 1 s) of the earliest holder (the lease that
        -- expires first was taken first: elapsed = ttl - its time left),
        -- never the ttl; at least 1 s, at most the earliest expiry.
        outcome = function(e, raw)
            local d = commands.decode_lease(raw)
            if not d then
                return nil, bad_reply(raw)
            end
            local p = e.params
            local out = { binding = { name = e.name, limit = p.max, remaining = p.max - d.in_use,
                                      unit = "concurrent-requests" }, concurrency = p.max }
            if d.granted then
                out.state = "allowed"
                return out
            end
            out.state, out.retry_ms = "refused", _M.lease_retry_ms(p.ttl, p.expected, d.retry_after_ms)
            out.binding.remaining = 0
            return out
        end,
    },
}

_M.KINDS.distinct = distinct.kind

--- True when the key of entry `e` can be boxed (strikes with a box, or a
--- trip) and its rule keeps boxes in the edge deny cache (not with
--- `deny_cache = false`).
function _M.boxes(e)
    local p = e.params
    return (p.strikes or p.trip) and e.rule.deny_cache ~= false
end

--- The command recording the attempt of entry `e` (a rule counting
--- failures, with strikes, whose probe found no failure left) as one more
--- failure: that refusal is the offence, so it is sent with EVERY and
--- trips the box in this one command.
function _M.failure_offence_command(e)
    local cmd = _M.KINDS.window.command(e, e.cost, true)
    if not e.params.strikes.every_refusal then
        cmd[#cmd + 1] = "EVERY"
    end
    return cmd
end

--- A request refused (or a reply unusable) after every rule's command
--- ran: gives back what the admitted rules of `sent` took, in a second
--- pipelined round trip (only refused requests pay it): REFUND of their
--- cost for buckets, windows and quotas (never above full), RL.LEASE
--- RELEASE for the leases granted. The rules that refused keep their
--- charge (their strikes and boxes count); with `keep_charges` (a
--- refusal that is work done: the tier form's leases) only the leases
--- are given back. Not atomic with the first
--- round trip: in between, a concurrent request may see these points
--- spent (it can be refused, never admitted beyond a bound). A failed
--- round trip is counted as a Redis error; its leases are released
--- again after the response.
function _M.compensate(conf, state, sent, keep_charges)
    local cmds, released = {}, {}
    for _, e in ipairs(sent) do
        local o = e.outcome
        if o and (o.state == "allowed" or o.state == "delayed") then
            if e.params.kind == "lease" then
                -- (the request id was read when its ACQUIRE was made)
                cmds[#cmds + 1] = { "RL.LEASE", "RELEASE", e.key, state.request_id }
                released[e.key] = true
            elseif not keep_charges and not e.probe and e.cost > 0 then
                cmds[#cmds + 1] = _M.KINDS[e.params.kind].command(e, e.cost, false, nil, true)
            end
        end
    end
    local res, err = commands.pipeline_ok(conf, cmds)
    if not res then
        metrics.redis_error(conf, err)
        state.redis_error = "refund: " .. tostring(err)
        return
    end
    local kept = {}
    for _, l in ipairs(state.leases) do
        if not released[l.key] then
            kept[#kept + 1] = l
        end
    end
    state.leases = kept
end

return _M
