-- resty.rl.limit.quota_alerts: quota threshold events of a rule policy. A rule
-- with a calendar quota (RL.QUOTA) and `quota_alerts = {thresholds =
-- {80, 100}}` appends one entry to the quota stream (rlctl watch reads it:
-- rlctl/README.md, "Quota events") when an admitted request takes the
-- quota's use across one or more of its thresholds (the highest one):
--
--   XADD rl:events:quota MAXLEN ~ 100000 * tenant <id> quota <name>
--        used <points used> limit <quota> period <YYYY-MM> threshold <percent>
--
-- The crossing is read from the module's reply (used before and after this
-- request's cost: RL.QUOTA is atomic, so of concurrent requests exactly one
-- crosses each threshold), so a request below every threshold writes
-- nothing more. A crossing writes `SET <key>:alerted:<quota>:<period>:<percent>
-- NX` for each threshold crossed first and appends only when a marker is
-- new (naming the highest new one): a threshold crossed again in the same
-- period (points given back by REFUND) is not announced twice.

local commands = require "resty.rl.redis.commands"

local _M = {}

--- The period label of a quota period now (UTC): `2026-12` for MONTH,
--- the ISO week `2026-W49` for WEEK, `2026-12-01` for DAY.
function _M.period_label(period)
    local t = ngx.time()
    if period == "DAY" then
        return os.date("!%Y-%m-%d", t)
    elseif period == "WEEK" then
        return os.date("!%G-W%V", t)
    end
    return os.date("!%Y-%m", t)
end

--- The thresholds (percent) that `cost` took the use across: used before
--- the request below, used after at or above each.
function _M.crossed(thresholds, limit, remaining, cost)
    local after = limit - remaining
    local before = after - cost
    local out = {}
    for _, t in ipairs(thresholds) do
        if before * 100 < t * limit and t * limit <= after * 100 then
            out[#out + 1] = t
        end
    end
    return out
end

--- The event of quota rule entry `e` whose charge of `cost` left the
--- quota `b` ({name, limit, remaining, reset_ms}: the reply's), or nil
--- when it crossed no threshold: {markers, thresholds (ascending, as
--- configured), ttl_ms, fields (without the threshold)}.
function _M.event(state, e, b, cost)
    local qa = e.rule.quota_alerts
    if not qa or cost <= 0 or b.limit <= 0 then
        return nil
    end
    local crossed = _M.crossed(qa.thresholds, b.limit, b.remaining, cost)
    if #crossed == 0 then
        return nil
    end
    local period = e.params.period
    for i, name in ipairs(e.also_names) do
        if name == b.name then
            period = e.params.also[i].period
        end
    end
    local label = _M.period_label(period)
    local markers = {}
    for i, t in ipairs(crossed) do
        markers[i] = e.key .. ":alerted:" .. b.name .. ":" .. label .. ":" .. t
    end
    return {
        markers = markers, thresholds = crossed,
        -- the period's end and a day more (clocks differ a little)
        ttl_ms = (b.reset_ms or 0) + 86400000,
        fields = { "tenant", state.ident and state.ident.attrs[qa.owner] or "", "quota", b.name,
                   "used", b.limit - b.remaining, "limit", b.limit, "period", label },
    }
end

--- The events of a finished request (log phase: no Redis): one per
--- admitted quota rule counting requests whose charge crossed
--- thresholds (rules counting response bytes: after their charge, in
--- resty.rl.decide.log_phase).
function _M.events(state)
    local out = {}
    if not state.admitted then
        return out
    end
    for _, e in ipairs(state.entries or {}) do
        local o = e.outcome
        if e.rule.quota_alerts and e.rule.count == "requests" and o and o.binding
            and o.state == "allowed" then
            out[#out + 1] = _M.event(state, e, o.binding, e.cost)
        end
    end
    return out
end

--- Appends `events` (after the response, in a timer): the markers in one
--- round trip, in a second one entry per event with a new marker (the
--- highest threshold whose marker is new). Returns the number appended,
--- or nil and an error.
function _M.send(conf, events)
    local sets = {}
    for _, ev in ipairs(events) do
        for _, m in ipairs(ev.markers) do
            sets[#sets + 1] = { "SET", m, "1", "NX", "PX", ev.ttl_ms }
        end
    end
    local res, err = commands.pipeline(conf, sets)
    if not res then
        return nil, err
    end
    local adds, n = {}, 0
    for _, ev in ipairs(events) do
        local highest
        for i, t in ipairs(ev.thresholds) do
            if res[n + i] == "OK" and (not highest or t > highest) then
                highest = t
            end
        end
        n = n + #ev.markers
        if highest then
            local cmd = { "XADD", conf.quota_alerts.stream, "MAXLEN", "~",
                          conf.quota_alerts.maxlen, "*" }
            for _, f in ipairs(ev.fields) do
                cmd[#cmd + 1] = f
            end
            cmd[#cmd + 1] = "threshold"
            cmd[#cmd + 1] = highest
            adds[#adds + 1] = cmd
        end
    end
    if #adds == 0 then
        return 0
    end
    res, err = commands.pipeline(conf, adds)
    if not res then
        return nil, err
    end
    return #adds
end

return _M
