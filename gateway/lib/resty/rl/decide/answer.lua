-- resty.rl.decide.answer: how the engine's decision answers a request: the
-- winning outcome of its entries (the strictest refusal; the tightest
-- binding of an admitted request), the RateLimit-Policy and RateLimit
-- fields, and the refusals' status, headers and problem bodies (the
-- wording a rule gives, or its own `describe`).

local headers = require "resty.rl.format.headers"
local problem = require "resty.rl.format.problem"
local deny = require "resty.rl.limit.deny"
local limiters = require "resty.rl.limit.limiters"
local phases = require "resty.rl.decide.phases"
local memo = require "resty.rl.base.memo"
local hotpath = require "resty.rl.base.hotpath"

local single = hotpath.single

local _M = {}

local null = ngx.null
-- An empty table, never written (an option not given).
local NONE = {}

-- RateLimit-Policy values of entries with a static limiter, by rule and tier.
local policy_fields = memo.new(10000, true)
local function policy_of(_rule, _tier, make, e)
    return make(e)
end

-- The RateLimit-Policy value of entry `e`, made by `make(e)`; kept per
-- rule and tier when its limiter is static (`e.static`: the value then
-- depends on nothing else). A quota's is made each time: its window,
-- the calendar month's length, changes with the date.
local function policy_field(e, make)
    if not e.static or e.params.kind == "quota" then
        return make(e)
    end
    return policy_fields:peek(e.rule, e.tier)
        or policy_fields:get(e.rule, e.tier, policy_of, make, e)
end

-- Ranks a hard refusal: a box without end first, then the longest wait
-- in whole seconds, as Retry-After says it. Refusals whose waits round to
-- the same second rank alike, and the rule listed first wins: which
-- millisecond each Redis call saw does not pick the answer.
local function severity(o)
    return o.retry_ms and headers.seconds(o.retry_ms) or math.huge
end

--- The strictest outcome of `entries` (a hard refusal, else a soft block,
--- else nil when everything was admitted). Among boxes the strictest box
--- (resty.rl.limit.deny.stricter: the highest level, then the latest end, as
--- the edge deny cache answers); between it and the other refusals, the
--- one without end, then the longest wait.
function _M.strictest(entries)
    local one = single(entries)
    if one then
        -- one entry, without a loop (resty.rl.base.hotpath)
        local o = one.outcome
        return o and (o.state == "refused" or o.state == "boxed") and one or nil
    end
    local box, hard, soft
    for _, e in ipairs(entries) do
        local o = e.outcome
        if o and (o.state == "refused" or o.state == "boxed") then
            if e.rule.on_refusal.action == "soft" then
                soft = soft or e
            elseif o.state == "boxed" then
                if not box or deny.stricter(o, box.outcome) then
                    box = e
                end
            elseif not hard or severity(o) > severity(hard.outcome) then
                hard = e
            end
        end
    end
    if box and (not hard or severity(box.outcome) >= severity(hard.outcome)) then
        return box
    end
    return hard or box or soft
end

-- The RateLimit binding of an admitted request: the rate entry with the
-- smallest share of its limit left (with `by_remaining`, the fewest
-- units left: the tier form's), a distinct rule's members only when no
-- rate entry applies (they are not requests left).
function _M.tightest(entries, by_remaining)
    local e = single(entries)
    if e then
        return e.outcome and e.outcome.binding and e.params.kind ~= "lease" and e or nil
    end
    local best, share, members
    for _, e in ipairs(entries) do
        local b = e.outcome and e.outcome.binding
        if b and e.params.kind == "distinct" then
            members = members or e
        elseif b and e.params.kind ~= "lease" then
            local s = by_remaining and b.remaining or b.remaining / math.max(b.limit, 1)
            if not share or s < share then
                best, share = e, s
            end
        end
    end
    return best or members
end

-- The RateLimit-Policy items of entry `e`, as a field value ("" for a
-- rule with `policy_header = false`).
local function entry_policy(e)
    if e.rule.policy_header == false then
        return ""
    end
    return headers.policy(limiters.KINDS[e.params.kind].policies(e))
end

--- Sets RateLimit-Policy (every entry that applied) and RateLimit.
function _M.rate_headers(conf, state, binding_entry)
    local entries = state.entries
    local one = single(entries)
    if one then
        -- one entry (the common case): its value, without a list
        local v = policy_field(one, entry_policy)
        if v ~= "" then
            state.headers["RateLimit-Policy"] = v
        end
    else
        local fields = {}
        for _, e in ipairs(entries) do
            local v = policy_field(e, entry_policy)
            if v ~= "" then
                fields[#fields + 1] = v
            end
        end
        if #fields > 0 then
            state.headers["RateLimit-Policy"] = #fields == 1 and fields[1]
                or table.concat(fields, ", ")
        end
    end
    local b = binding_entry and binding_entry.outcome and binding_entry.outcome.binding
    if b then
        state.binding = b
        state.binding_entry = binding_entry
        headers.ratelimit_field(state.headers, conf, b)
    end
end

-- The `detail`/`message` of a refusal by `name` (the binding policy).
local function message(e, o, secs, name)
    local a = e.rule.on_refusal
    if a.message then
        return a.message
    end
    if o.state == "boxed" then
        return string.format("%s: locked (level %d) after repeated refusals; %s.", name,
            o.level or 0, secs and ("retry in " .. secs .. " s") or "until a manual review")
    end
    if e.params.kind == "lease" then
        return string.format("%s: at most %d concurrent request(s); retry in %d s.", name,
            e.params.max, secs or 1)
    end
    return string.format("%s: %d %s per %s s exhausted (this request: %d); %s.", name,
        o.binding.limit, e.rule.unit, tostring(o.binding.window), e.cost,
        secs and ("retry in " .. secs .. " s") or "it never fits")
end

--- Answers the winning refusal `e` (or lets it through in shadow mode),
--- counted as `decision_as` when given. The body, the event line and
--- RateLimit name the same policy: the bucket that refused (an `also`
--- bucket, such as the tenant's, is named as itself).
function _M.refuse_with(conf, req, state, e, decision_as)
    local o, a = e.outcome, e.rule.on_refusal
    local name = o.binding and o.binding.name or e.name
    local secs = o.retry_ms and headers.seconds(o.retry_ms) or nil
    state.policy, state.retry_after, state.box_level = name, secs, o.level ~= 0 and o.level or nil
    state.strikes_remaining, state.cost = o.strikes, e.cost
    local kind, decision = a.type, "throttled"
    if o.state == "boxed" then
        kind, decision = "penalty-box-active", "boxed"
        state.headers["X-Penalty-Box-Status"] = "Active-Lockout"
        local len = e.params.box and e.params.box[o.level]
            or e.params.trip and e.params.trip.duration or 0
        headers.retry_after(state.headers, o.retry_ms, len >= conf.http_date_after)
    else
        if e.params.kind == "lease" then
            kind, decision = "concurrency-limit-exceeded", "conflict"
        elseif a.action == "quota" then
            decision = "quota_exceeded"
        elseif a.action == "challenge" then
            decision = "challenged"
        end
        -- A warning once strikes count (an early retry), not on a refusal
        -- that only announces its Retry-After.
        if o.strikes and e.params.strikes and o.strikes < e.params.strikes.threshold then
            state.headers["X-Penalty-Box-Status"] = "Warning"
        end
        headers.retry_after(state.headers, o.retry_ms, false)
    end
    for k, v in pairs(a.headers or {}) do
        state.headers[k] = v
    end
    local status = a.status
    if o.state == "boxed" and not o.retry_ms then
        status = conf.manual_box_status
    end
    decision = a.decisions and a.decisions[decision] or decision
    -- a policy's own wording (the tier form's): {detail, tier, strikes}
    local own = a.describe and a.describe(e, o, secs, name) or NONE
    local vars = {
        status = status, type = kind, message = own.detail or message(e, o, secs, name),
        retry_after = secs or null, policy = name, tier = own.tier or state.tier_name or null,
        strikes = own.strikes or o.strikes or null,
        level = o.level ~= 0 and o.level or null, block_type = a.block_type or null,
        upgrade_url = a.upgrade_url or null, challenge = a.challenge or null,
        concurrency_limit = o.concurrency or null, instance = req.path(),
        request_id = phases.request_id(state), error = a.error or null,
        degraded = state.degraded or null,
        ends_at = (o.state == "boxed" and o.retry_ms)
            and problem.timestamp(headers.ends_at(o.retry_ms)) or null,
    }
    if not phases.refusing(conf, state, status, decision_as or decision) then
        return
    end
    local ctype, body = problem.render(conf, vars, o.state == "boxed", a.fields)
    return phases.exit(req, state, status, ctype, body)
end

--- A refusal that is not a rule's (401, 400, the fail-closed 503): a
--- problem body; `retry_after` the seconds of its Retry-After, if any (the
--- body says the same).
function _M.refuse_plain(conf, req, state, status, kind, decision, detail, retry_after)
    if not phases.refusing(conf, state, status, decision) then
        return
    end
    local ctype, body = problem.render(conf, { status = status, type = kind,
        message = detail, instance = req.path(), request_id = phases.request_id(state),
        tier = state.tier_name or null, retry_after = retry_after or null }, false)
    return phases.exit(req, state, status, ctype, body)
end

return _M
