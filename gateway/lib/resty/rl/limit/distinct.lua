-- resty.rl.limit.distinct: the "distinct members" limiter kind of a rule policy
-- (RL.DISTINCT): how many different members (a subject, an IP, any
-- attribute of the request) a rule's key saw in a sliding window, with a
-- box tripped at a chosen level when there are too many. Its validation
-- is in resty.rl.policy.rules (KINDS.distinct); resty.rl.limit.limiters lists `kind`
-- below as KINDS.distinct.
--
-- With `count = "requests"` every request records its member in the
-- access phase (`TRIP` given to the module: the trip is atomic). With
-- `count = "failures"` (the credential-stuffing rules) the access phase
-- only looks (`PEEK`: a boxed key refuses), and the member is recorded
-- after the response when its status is one of `fail_statuses`
-- (record_failures, in the after-response timer). `min_events` adds a
-- second condition to the trip: at least that many failures counted on
-- the key's event window (`<key>:events`, an exact RL.WINDOW) within the
-- same window; the trip is then a second RL.DISTINCT with `TRIP`, which
-- an already active box answers without a new offense (so concurrent
-- failures trip once).

local commands = require "resty.rl.redis.commands"

local _M = {}

-- RL.DISTINCT's arguments for an entry, `extra` appended.
local function distinct_cmd(e, extra)
    local p = e.params
    local args = { "RL.DISTINCT", e.key, e.member, p.limit, p.window }
    for _, x in ipairs(extra or {}) do
        args[#args + 1] = x
    end
    return args
end

-- The TRIP option of an entry (none without `trip`).
local function trip(p)
    if not p.trip then
        return {}
    end
    return { "TRIP", p.trip.level, p.trip.duration }
end

-- The event window of an entry with `min_events`: one failure more.
local function events_cmd(e)
    return { "RL.WINDOW", e.key .. ":events", e.params.min_events - 1, e.params.window,
             "COST", 1, "EXACT" }
end

-- The state of an RL.DISTINCT reply status (-1: boxed).
local STATES = { [1] = "allowed", [0] = "refused", [-1] = "boxed" }

--- The outcome of an RL.DISTINCT reply (resty.rl.limit.limiters' outcome form),
--- or nil and an error. A probe of a rule with `min_events` is never
--- refused for the count alone (only the trip, after a failure, acts).
local function outcome(e, raw)
    local d = commands.decode(raw)
    if not d then
        return nil, "unexpected reply: " .. tostring(type(raw) == "table" and raw[2] or raw)
    end
    local p = e.params
    local out = {
        level = d.box_level,
        binding = { name = e.name, limit = d.limit, remaining = d.remaining,
                    reset_ms = d.reset_ms, window = p.window, unit = e.rule.unit, clamp = true },
    }
    out.state = STATES[d.status] or "boxed"
    if out.state == "refused" and e.probe and p.min_events then
        out.state = "allowed"
    end
    if out.state ~= "allowed" then
        out.retry_ms = d.retry_after_ms
    end
    if out.state == "boxed" then
        out.binding.remaining, out.binding.boxed = 0, true
    end
    return out
end
_M.outcome = outcome

--- The limiter kind (see resty.rl.limit.limiters): a recording call, or `PEEK`
--- for a probe; nothing to refund (a member seen stays seen).
_M.kind = {
    command = function(e, _cost, _record, _request_id, refund)
        if refund then
            return nil
        end
        if e.probe then
            return distinct_cmd(e, { "PEEK" })
        end
        return distinct_cmd(e, trip(e.params))
    end,
    policies = function(e)
        return { { name = e.name, quota = e.params.limit, window = e.params.window,
                   unit = e.rule.unit } }
    end,
    outcome = outcome,
}

--- The entries of a finished request whose failure a distinct rule
--- records: a response status in the rule's `fail_statuses`, whether this
--- request was admitted or refused by another rule (a lockout's 429 is a
--- failed attempt too when listed), not when this rule's own key is
--- boxed (the module would record nothing).
function _M.failures(state, status)
    local out = {}
    for _, e in ipairs(state.entries or {}) do
        if e.params.kind == "distinct" and e.rule.count == "failures"
            and e.rule.fail_set[status] and not (e.outcome and e.outcome.state == "boxed") then
            out[#out + 1] = e
        end
    end
    return out
end

--- Records the failures of `entries` (after the response, in a timer):
--- one pipelined round trip with each member (and its event when the
--- rule has `min_events`), a second one only for the rules whose both
--- conditions now hold (the trip). Returns the entries now boxed (their
--- `outcome` set: level, retry_ms), or nil and an error.
function _M.record_failures(conf, entries)
    local cmds, at = {}, {}
    for i, e in ipairs(entries) do
        if e.params.min_events then
            cmds[#cmds + 1] = events_cmd(e)
            cmds[#cmds + 1] = distinct_cmd(e)
        else
            cmds[#cmds + 1] = distinct_cmd(e, trip(e.params))
        end
        at[i] = #cmds
    end
    local res, err = commands.pipeline(conf, cmds)
    if not res then
        return nil, err
    end
    local boxed, trips, tripping = {}, {}, {}
    for i, e in ipairs(entries) do
        local d = commands.decode(res[at[i]])
        if d and d.status == -1 then
            boxed[#boxed + 1] = e
            e.outcome = { state = "boxed", level = d.box_level, retry_ms = d.retry_after_ms }
        elseif d and d.status == 0 and e.params.min_events and e.params.trip then
            local ev = commands.decode(res[at[i] - 1])
            -- the event window refuses: min_events - 1 were counted already
            if ev and ev.status == 0 then
                trips[#trips + 1] = distinct_cmd(e, trip(e.params))
                tripping[#tripping + 1] = e
            end
        elseif not d then
            return nil, "unexpected reply: " .. tostring(type(res[at[i]]) == "table"
                and res[at[i]][2] or res[at[i]])
        end
    end
    if #trips == 0 then
        return boxed
    end
    res, err = commands.pipeline(conf, trips)
    if not res then
        return nil, err
    end
    for j, e in ipairs(tripping) do
        local d = commands.decode(res[j])
        if d and d.status == -1 then
            boxed[#boxed + 1] = e
            e.outcome = { state = "boxed", level = d.box_level, retry_ms = d.retry_after_ms }
        end
    end
    return boxed
end

return _M
