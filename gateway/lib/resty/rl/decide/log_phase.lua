-- resty.rl.decide.log_phase: the log phase of a rule policy (resty.rl.decide.engine) and
-- the work after the response, in a timer (the log phase cannot use
-- cosockets): failures recorded (count = failures), response bytes
-- charged (count = response_bytes), post-paid rules settled
-- (resty.rl.limit.settle), leases released, the alerts of boxes that reached
-- an alerting level added to the alert stream, the failures of distinct
-- rules recorded (resty.rl.limit.distinct) and quota threshold events appended
-- (resty.rl.limit.quota_alerts).

local refs = require "resty.rl.policy.refs"
local limiters = require "resty.rl.limit.limiters"
local commands = require "resty.rl.redis.commands"
local headers = require "resty.rl.format.headers"
local deny = require "resty.rl.limit.deny"
local settle = require "resty.rl.limit.settle"
local distinct = require "resty.rl.limit.distinct"
local quota_alerts = require "resty.rl.limit.quota_alerts"
local phases = require "resty.rl.decide.phases"
local metrics = require "resty.rl.observe.metrics"
local usage_counts = require "resty.rl.observe.usage_counts"
local cjson = require "cjson.safe"

local _M = {}

-- The attributes a refused-request log line carries.
local function log_ident(state)
    local a = state.ident and state.ident.attrs or {}
    return a.tenant, a.key_id, a.user, a.brand
end

--- The alert of a box reached by `e` (XADD to the alert stream), or nil
--- when its level does not alert or this node sent it already.
local function alert(conf, state, e)
    local al, o = e.rule.alerts, e.outcome
    if not al or (o.level or 0) < al.from_level then
        return nil
    end
    local ident = state.ident or { attrs = {} }
    local action = o.level >= 3 and refs.resolve(al.level3, ident) or "notify"
    if action == "suspend" and o.retry_ms and o.retry_ms > 0 then
        -- a timed level-3 box (a distinct rule's trip): ban the source for its time
        action = "ban"
    end
    if not deny.once(conf, e.key .. ":" .. o.level, o.retry_ms and o.retry_ms / 1000 or 3600) then
        return nil
    end
    local tenant, key_id, user, brand = log_ident(state)
    return { "XADD", conf.alerts.stream, "MAXLEN", "~", conf.alerts.maxlen, "*",
        "level", o.level, "action", action, "policy", e.name, "tier", state.tier_name or "",
        "tenant", tenant or "", "key_id", key_id or "", "user", user or "", "brand", brand or "",
        "ip", ident.attrs.ip or "", "subject", ident.attrs.subject or "", "key", e.key,
        "route", state.route.name, "box_seconds", o.retry_ms and headers.seconds(o.retry_ms) or -1,
        "request_id", phases.request_id(state) }
end

-- The failures of distinct rules (`failed`): recorded; the boxes they
-- trip go to the edge deny cache and, at an alerting level, to the alert
-- stream.
local function record_distinct(conf, state, failed, warn)
    local boxed, err = distinct.record_failures(conf, failed)
    if not boxed then
        phases.work_failed(conf, warn, "distinct members not recorded", err)
        return
    end
    local cmds = {}
    for _, e in ipairs(boxed) do
        deny.put(conf, e.key, e.outcome.level, e.outcome.retry_ms)
        cmds[#cmds + 1] = alert(conf, state, e)
    end
    if #cmds > 0 and not commands.pipeline(conf, cmds) then
        warn("rl: the alert of a distinct rule's box was not added")
    end
end

-- After the response (a timer): record failures, release leases, add the
-- alerts of boxes that reached an alerting level, record distinct
-- members, append quota events (`later`: {state, failed, quota}).
local function after_response(_premature, conf, cmds, egress, warn, later)
    local res, err = commands.pipeline(conf, cmds)
    if not res then
        phases.work_failed(conf, warn, "after-response work failed", err)
    end
    if #later.failed > 0 then
        record_distinct(conf, later.state, later.failed, warn)
    end
    for _, x in ipairs(egress) do
        -- the bytes sent, or what is left when they do not fit (the quota
        -- is then used up: all-or-nothing would count nothing)
        local cost = math.min(x.bytes, x.e.params.limit)
        res, err = commands.pipeline(conf, { limiters.KINDS[x.e.params.kind].command(x.e, cost, true) })
        local d = res and commands.decode(res[1])
        if d and d.status == 0 and d.remaining > 0 then
            cost = d.remaining
            res, err = commands.pipeline(conf,
                { limiters.KINDS[x.e.params.kind].command(x.e, cost, true) })
            d = res and commands.decode(res[1])
        end
        if d and d.status == 1 then
            -- a quota's thresholds crossed by these bytes
            later.quota[#later.quota + 1] = quota_alerts.event(later.state, x.e,
                { name = x.e.name, limit = d.limit, remaining = d.remaining,
                  reset_ms = d.reset_ms }, cost)
        end
        if not res then
            phases.work_failed(conf, warn, "response bytes not counted", err)
        end
    end
    if #later.quota > 0 then
        local _, qerr = quota_alerts.send(conf, later.quota)
        if qerr then
            phases.work_failed(conf, warn, "quota events not added", qerr)
        end
    end
end

-- The fields of the event line of a refused request (count_and_log).
local function event(_req, state, status)
    local tenant, key_id, user, brand = log_ident(state)
    return {
        request_id = phases.request_id(state), decision = state.decision,
        would_be = state.would_be,
        route = state.route.name, tenant = tenant, key_id = key_id, user = user,
        brand = brand, tier = state.tier_name or nil, status = status,
        policy = state.policy or nil, retry_after = state.retry_after, box_level = state.box_level,
        strikes_remaining = state.strikes_remaining or nil, redis_error = state.redis_error,
        deny_cache = state.deny_cached, cost = state.cost or nil,
        -- a login's refusal: who was refused (a client id is no secret)
        subject = state.ident and state.ident.attrs.subject or nil,
        client_ip = state.ident and state.ident.attrs.ip or nil,
    }
end

-- Decisions without an event line.
local QUIET = { allowed = true, degraded_allowed = true }

-- The log phase's first part: the decision counters (resty.rl.observe.metrics,
-- resty.rl.observe.usage_counts) and, for a refused (or, in shadow mode, would-be
-- refused) request, one `rl_event` JSON line with the fields
-- `event(req, state, status)` gives. Returns the state, or nil when the
-- request has no state (an internal redirect). (The response status is
-- read only where it is needed: not on the allowed path, whose log phase
-- ends after the counters.)
local function count_and_log(conf, req, event)
    local state = req.ctx().rl
    if not state then
        return nil
    end
    metrics.decision(conf, state.decision, state.route.name, state.tier_name)
    usage_counts.count(conf, state)
    if not QUIET[state.decision] then
        req.warn("rl_event " .. (cjson.encode(event(req, state, req.status())) or "{}")
            :gsub("\\/", "/"))
    end
    return state
end

--- Does `rule` work in the log phase (count failures or response bytes,
--- settle, quota alerts, distinct members)?
function _M.works_after(rule)
    return rule.count ~= "requests" or rule.settle ~= nil or rule.quota_alerts ~= nil
        or rule.limiter.kind == "distinct"
end

--- Log phase of a rule policy: counters, one structured line per
--- refusal, and the work after the response (in a timer). Without an
--- entry of a rule that works here (works_after: the engine's
--- state.steps.log), a request without leases or boxes has nothing more
--- to do once counted: its state is then returned (no timer holds it).
function _M.log(conf, req)
    local state = count_and_log(conf, req, event)
    if not state then
        return nil
    end
    if not (state.steps and state.steps.log) and state.leases[1] == nil and not state.boxed then
        return state
    end
    local status = req.status()
    local cmds, egress = {}, {}
    local settles
    if state.admitted then
        for _, e in ipairs(state.entries) do
            settles = settles or e.rule.settle ~= nil
            if e.rule.count == "failures" and e.params.kind == "window"
                and e.rule.fail_set[status] then
                cmds[#cmds + 1] = limiters.KINDS.window.command(e, e.cost, true)
            elseif e.rule.count == "response_bytes" then
                local bytes = req.bytes_sent()
                if bytes and bytes > 0 then
                    egress[#egress + 1] = { e = e, bytes = bytes }
                end
            end
        end
    end
    if settles then
        -- post-paid rules: DEBT or REFUND of the actual cost's difference
        settle.commands(state, limiters.KINDS, req.bytes_sent(), req.warn, cmds)
    end
    for _, l in ipairs(state.leases) do
        cmds[#cmds + 1] = { "RL.LEASE", "RELEASE", l.key, l.id }
    end
    for _, e in ipairs(state.boxed or {}) do
        cmds[#cmds + 1] = alert(conf, state, e)
    end
    local later = { state = state, failed = distinct.failures(state, status),
                    quota = quota_alerts.events(state) }
    if #later.failed > 0 then
        -- read now: the timer has no request (an alert names it)
        phases.request_id(state)
    end
    if #cmds > 0 or #egress > 0 or #later.failed > 0 or #later.quota > 0 then
        phases.after(req, after_response, conf, cmds, egress, req.warn, later)
    end
end

return _M
