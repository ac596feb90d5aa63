-- resty.rl.decide.engine: a rule policy applied to requests (every
-- configuration: the tier form is translated into one, resty.rl.policy.tier_form;
-- resty.rl.gateway hands them here). Per request:
--   1. the route and the caller (resty.rl.request.identity);
--   2. every rule that matches and whose scope the caller has (its entry:
--      resty.rl.decide.matching);
--   3. the edge deny cache: a rule key known to be boxed answers at once
--      (the strictest box of the request: resty.rl.limit.deny.strictest_entry);
--   4. one round trip with every rule's command (RL.TAKE, RL.WINDOW,
--      RL.QUOTA, RL.LEASE ACQUIRE, RL.DISTINCT; a probe for rules that count
--      failures),
--      pipelined (each command atomic on its own), decoded by
--      resty.rl.limit.limiters; when the request is refused, a second round
--      trip gives back what the admitted rules took (resty.rl.limit.limiters.compensate);
--   5. the strictest outcome wins (of several boxes the highest level,
--      then the latest end; then a refusal without end, then the longest
--      Retry-After; a soft block only when nothing refuses); its action
--      answers (reject, quota, challenge: resty.rl.decide.answer) or marks the
--      request (soft);
--   6. after the response (log phase, in a timer, resty.rl.decide.log_phase): failures
--      recorded, leases released, level-2/3 box alerts added to the alert
--      stream, distinct members recorded, quota threshold events appended.
-- Rules with `allowance` spend their node's points without Redis in step 4
-- (resty.rl.limit.allowance); rules with `settle` are settled in step 6
-- (resty.rl.limit.settle).

local identity = require "resty.rl.request.identity"
local refs = require "resty.rl.policy.refs"
local limiters = require "resty.rl.limit.limiters"
local commands = require "resty.rl.redis.commands"
local headers = require "resty.rl.format.headers"
local fallback = require "resty.rl.limit.fallback"
local deny = require "resty.rl.limit.deny"
local answer = require "resty.rl.decide.answer"
local log_phase = require "resty.rl.decide.log_phase"
local allowance = require "resty.rl.limit.allowance"
local settle = require "resty.rl.limit.settle"
local phases = require "resty.rl.decide.phases"
local matching = require "resty.rl.decide.matching"
local hotpath = require "resty.rl.base.hotpath"

local _M = {}

local Engine = {}
Engine.__index = Engine

-- An empty table, never written (an option not given, a list that
-- stays empty).
local NONE = {}

-- The rules of `list` that may match requests of `route` (those without
-- match.routes, or naming it).
local function rules_of_route(list, route)
    local out = {}
    for _, rule in ipairs(list) do
        local set = rule.match.route_set
        if not set or set[route.name] then
            out[#out + 1] = rule
        end
    end
    return out
end

--- An engine for a compiled rule policy (resty.rl.policy.config.build).
function _M.new(conf)
    if conf.trusted_proxies then
        conf.trusted = identity.trust(conf.trusted_proxies)
    end
    -- the rules whose soft refusal marks the upstream request (the mark
    -- a client sends is removed first)
    local soft = {}
    -- the steps some rules need, left out of every request when none does
    local needs = { delays = false, settles = false }
    for _, rule in ipairs(conf.rules) do
        if rule.on_refusal.action == "soft" then
            soft[#soft + 1] = rule
        end
        needs.delays = needs.delays or rule.limiter.delay ~= nil
        needs.settles = needs.settles or rule.settle ~= nil
        -- (a request with an entry of such a rule does the step: state.steps)
        rule.works_after = log_phase.works_after(rule)
    end
    -- per route, the rules that may match it (match.routes): a request
    -- walks only those (one rule: no loop, resty.rl.base.hotpath)
    local route_rules = {}
    for _, route in ipairs(conf.routes) do
        route_rules[route] = rules_of_route(conf.rules, route)
    end
    route_rules[conf.default_route] = rules_of_route(conf.rules, conf.default_route)
    -- the most entries a request can have (room made for them at once)
    local most = 1
    for _, list in pairs(route_rules) do
        most = math.max(most, #list)
    end
    -- the methods every request calls in the engine's own fields too: one
    -- found through the metatable costs each call a failed lookup in the
    -- engine first
    return setmetatable({ conf = conf, soft_rules = soft, needs = needs, route_rules = route_rules,
                          most_entries = most,
                          upstream_headers = next(conf.upstream_headers) ~= nil,
                          access = Engine.access, add_entries = Engine.add_entries,
                          round_trip = Engine.round_trip, replied = Engine.replied,
                          decided = Engine.decided, header_filter = Engine.header_filter,
                          body_filter = Engine.body_filter, log = Engine.log }, Engine)
end

--- One attempt in flight per scope (`one_in_flight` of a rule counting
--- failures, e.g. logins per subject): the attempt lease `<key>:attempt`,
--- held until this attempt's failure is recorded after the response, so
--- that parallel guesses cannot all pass the probe before the first
--- failure counts. An attempt waits (polling) up to wait_ms for the
--- previous one. Returns nil (granted), a refusal entry, or nil, error.
function Engine:one_in_flight(state, e)
    local f = e.rule.one_in_flight
    local key = e.key .. ":attempt"
    local id = phases.request_id(state)
    phases.add_lease(state, { key = key, id = id })
    -- the route's Redis budget (routes[i].timeout_ms), else redis.timeout_ms
    local res, err = phases.acquire_waiting(state.route.store_conf or self.conf, key, f.ttl,
        id, f.wait_ms)
    if not res then
        return nil, err
    end
    if res.granted then
        return nil
    end
    -- not ours: nothing to release
    state.leases[#state.leases] = nil
    return { rule = e.rule, name = e.name, params = { kind = "lease", max = 1 }, cost = e.cost,
             outcome = { state = "refused", retry_ms = f.retry_after * 1000, concurrency = 1,
                         binding = { name = e.name, limit = 1, remaining = 0 } } }
end

--- Redis failed: a box the edge deny cache knows (stale: not confirmed
--- lately) answers; else fail closed (503) when a rule says so (or the
--- route is critical and the rule does not say otherwise); else each
--- bucket and window rule runs on the local per-worker limiter at
--- fallback_ratio, and quota and lease rules let the request through.
function Engine:redis_failed(req, state, err)
    local conf = self.conf
    phases.redis_error(conf, state, err)
    -- boxes this node knows but could not confirm: still refused
    local known = state.deny_stale and deny.strictest_known(state.entries)
    if known then
        state.deny_cached = true
        answer.rate_headers(conf, state, known)
        return answer.refuse_with(conf, req, state, known)
    end
    local entries = state.entries or {}
    local closed = state.route.critical and #entries == 0
    for _, e in ipairs(entries) do
        local mode = refs.resolve(e.rule.on_redis_failure, state.ident)
            or (state.route.critical and "closed" or "local")
        closed = closed or mode == "closed"
    end
    if closed then
        local wait, detail = phases.fail_closed(conf, state)
        if conf.fail_closed_policy then
            -- the static policies, but no live counter
            answer.rate_headers(conf, state, nil)
        end
        return answer.refuse_plain(conf, req, state, 503, "rate-limiter-unavailable",
            "failed_closed", detail, wait)
    end
    state.decision = "degraded_allowed"
    -- decided here, without Redis: the response (and a refusal's body) says so
    state.degraded = headers.DEGRADED_VALUE
    headers.degraded(state.headers)
    for _, e in ipairs(state.entries or {}) do
        local p, mode = e.params, refs.resolve(e.rule.on_redis_failure, state.ident) or "local"
        if mode == "local" and (p.kind == "bucket" or p.kind == "window") and not e.probe then
            fallback.decide_entry(conf, e)
        end
    end
    local win = answer.strictest(state.entries or {})
    answer.rate_headers(conf, state,
        win or answer.tightest(state.entries or {}, conf.binding_by_remaining))
    if win and win.rule.on_refusal.action ~= "soft" then
        return answer.refuse_with(conf, req, state, win, "degraded_throttled")
    elseif win then
        local a = win.rule.on_refusal
        req.set_upstream_header(a.mark_header, a.mark_value)
    end
    self:tell_upstream(req, state.ident)
end

--- The upstream headers (`upstream_headers`: the tier's priority, ...)
--- of an admitted request, decided or not by Redis: each set from the
--- caller, a client's own value replaced or removed.
function Engine:tell_upstream(req, ident)
    if not self.upstream_headers then
        return
    end
    for name, v in pairs(self.conf.upstream_headers) do
        local x = type(v) == "string" and ident.attrs[v:sub(6)] or refs.resolve(v, ident)
        req.set_upstream_header(name, x ~= nil and tostring(x) or nil)
    end
end

-- The steps of the access phase over a request's entries, one call per
-- item through resty.rl.base.hotpath (one entry: no loop, so that LuaJIT
-- compiles the phase).

-- A client cannot send a soft refusal's mark itself.
local function strip_mark(rule, _, req)
    req.set_upstream_header(rule.on_refusal.mark_header, nil)
end

-- Step 2: the entry of `rule` when it matches the request (added to
-- state.entries); "ambiguous" (or "invalid", "too_large") and the
-- argument's name when an argument it needs has no single valid value.
local function add_entry(rule, _, conf, req, state)
    local matched, merr, marg = matching.matches(rule, state.route, req)
    if merr then
        return merr, marg
    end
    if matched then
        local e, why, arg = matching.entry(conf, req, state, rule, state.ident)
        if why then
            return why, arg
        end
        if not e then
            -- an attribute of its scope missing: the rule does not apply
            return
        end
        local list = state.entries
        -- (the first one without `#list`: resty.rl.base.hotpath.single)
        list[list[1] == nil and 1 or #list + 1] = e
        -- the steps only some rules need, for this request
        if e.probe or rule.one_in_flight or rule.works_after then
            local steps = state.steps or {}
            state.steps = steps
            steps.probes = steps.probes or e.probe
            steps.one_in_flight = steps.one_in_flight or rule.one_in_flight ~= nil
            steps.log = steps.log or rule.works_after
        end
    end
end

-- Adds command `cmd` of entry `e` (state.entries[i]) to state.cmds and
-- `e` to state.sent, without a list of the request's own while they need
-- none: a lone shared command's one-command list (resty.rl.limit.limiters
-- .command_of: its `alone`), and state.entries itself while every entry
-- so far is sent (sent_entries trims it after the last); each is copied
-- into a list of the request's own before it would differ.
local function add_sent(state, e, i, cmd)
    local cmds, sent, entries = state.cmds, state.sent, state.entries
    if not cmds then
        state.cmds = cmd.alone or { cmd }
        state.sent = i == 1 and entries or { e }
        return
    end
    local n = #cmds
    if cmds == cmds[1].alone then
        cmds = { cmds[1] }
        state.cmds = cmds
    end
    cmds[n + 1] = cmd
    if sent == entries and i ~= n + 1 then
        sent = { unpack(entries, 1, n) }
        state.sent = sent
    end
    if sent ~= entries then
        sent[n + 1] = e
    end
end

-- The entries sent (after every plan, at least one): state.entries
-- itself only when all of them were sent (one entry sent is all of them).
local function sent_entries(state)
    local cmds, sent = state.cmds, state.sent
    if sent == state.entries and sent[2] ~= nil and #cmds < #sent then
        sent = { unpack(sent, 1, #cmds) }
        state.sent = sent
    end
    return sent
end

-- Step 4, before the round trip: entry `e` decided here (above its
-- capacity it never fits; or spent from the node's allowance), else its
-- command added to state.cmds and the entry to state.sent (add_sent: an
-- allowance spent locally needs neither).
local function plan(e, i, conf, state)
    local kind = limiters.KINDS[e.params.kind]
    if e.params.kind ~= "lease" and e.cost > limiters.capacity(e) then
        -- above the capacity: it never fits (the module would refuse the call)
        e.outcome = { state = "refused", retry_ms = nil, binding = { name = e.name,
            limit = limiters.capacity(e), remaining = 0, unit = e.rule.unit,
            window = e.params.window or e.params.period } }
    elseif e.rule.allowance and e.cost > 0 and allowance.spent(conf, e) then
        -- spent from the node's allowance: no Redis call
        return
    else
        -- the request id only for a lease (nginx makes it on first read:
        -- about 7,000 instructions of random bytes)
        local lease = e.params.kind == "lease"
        local cmd
        if lease then
            cmd = kind.command(e, e.cost, false, phases.request_id(state))
        elseif e.fetch then
            cmd = allowance.command(e)
        else
            cmd = limiters.command_of(e, e.probe and 0 or e.cost)
        end
        add_sent(state, e, i, cmd)
        if lease then
            -- recorded before the call: a timed-out ACQUIRE may have been granted
            phases.add_lease(state, { key = e.key, id = phases.request_id(state) })
        end
    end
end

-- Step 4, after it: the outcome of sent entry `e` from its reply `res[i]`;
-- the error when the reply is one.
local function decide(e, i, res)
    local raw = e.fetch and allowance.keep(e, res[i]) or res[i]
    local o, err = limiters.KINDS[e.params.kind].outcome(e, raw)
    e.outcome = o
    return err
end

-- A box the module reported for entry `e`: kept in the edge deny cache
-- and, for the log phase's alerts, in state.boxed; a cached box that
-- Redis no longer has is dropped.
local function note_box(e, _, conf, state)
    local o = e.outcome
    if o.state == "boxed" and not o.cached and limiters.boxes(e) then
        deny.put(conf, e.key, o.level, o.retry_ms)
        state.boxed = state.boxed or {}
        state.boxed[#state.boxed + 1] = e
    elseif e.known_box and o.state ~= "boxed" then
        -- the cached box is gone from Redis (released)
        deny.forget(conf, e.key)
    end
end

--- Access phase (see the file comment).
function Engine:access(req)
    local conf = self.conf
    local ident, err = identity.resolve(conf, req)
    local store_failed = not ident
    if store_failed then
        -- the identity store is away and this worker never saw the API
        -- key: it may be unknown, revoked or of any tier
        ident = { attrs = { tier = conf.default_tier }, overrides = {}, store_failed = true,
                  tier_data = conf.default_tier and conf.tiers[conf.default_tier] or {} }
    end
    local state = phases.start(conf, req, ident, matching.new_list(self.most_entries))
    if store_failed then
        phases.redis_error(conf, state, err)
        -- never admitted unchecked (an unknown caller is never treated
        -- better than a known one of the lowest tier): 503 as a route
        -- failing closed (in shadow mode the rules of its other attributes apply)
        local wait = phases.fail_closed(conf, state)
        return answer.refuse_plain(conf, req, state, 503, "rate-limiter-unavailable",
            "failed_closed", "The API key cannot be checked while the rate limiter is "
            .. "unavailable; retry in " .. wait .. " s.", wait)
    end
    local route = state.route
    hotpath.each(self.soft_rules, strip_mark, req)
    if ident.refused or (conf.identity.required and not ident.authenticated and not route.public
        and not ident.store_failed) then
        return answer.refuse_plain(conf, req, state, 401, "unauthenticated", "unauthenticated",
            ident.refused == "revoked" and "This API key is revoked."
            or ident.refused == "ambiguous" and "Send one API key: the "
                .. conf.identity.api_key.header .. " header came more than once."
            or conf.identity.unauthenticated_detail or "Send valid credentials.")
    end
    -- The rest in two methods: LuaJIT records a trace through the
    -- functions it calls, and the whole phase would be one trace too long
    -- to compile (too many constants); a trace that reaches a method
    -- compiled as a trace of its own, one that does not end in a return
    -- (add_entries': on to the Redis call), jumps into it instead. (Split
    -- by a call of a C function, gcinfo(), the phase cost two trace exits
    -- into the interpreter and back: 400-500 instructions more.)
    return self:add_entries(req, state)
end

--- Access phase, the caller known: the request's entries (step 2), and
--- the edge deny cache's answer (step 3).
function Engine:add_entries(req, state)
    local conf = self.conf
    local why, arg = hotpath.first_of(self.route_rules[state.route] or conf.rules, add_entry,
        conf, req, state)
    if arg == "subject" then
        -- the login subject's request argument
        arg = conf.subject_arg or "client_id"
    end
    if why == "too_large" then
        return answer.refuse_plain(conf, req, state, 413, "body-too-large", "invalid",
            "The request body is too large for the gateway to read its argument " .. arg
            .. ", on which a rate limit depends; send a smaller body.")
    elseif why == "unsupported" then
        return answer.refuse_plain(conf, req, state, 415, "body-unsupported", "invalid",
            "The gateway reads the argument " .. arg .. ", on which a rate limit depends, "
            .. "from the query string or a JSON or form-urlencoded body; send it so.")
    elseif why then
        return answer.refuse_plain(conf, req, state, 400, "ambiguous-argument", "invalid",
            "The argument " .. arg .. " is missing a single valid value (repeated, "
            .. "different in the query string and the body, not a number, or in a JSON "
            .. "body that does not decode).")
    end
    local entries = state.entries
    -- the edge deny cache: a known box answers without Redis
    local cached = deny.strictest_entry(conf, entries, state)
    if cached then
        state.deny_cached = true
        answer.rate_headers(conf, state, cached)
        return answer.refuse_with(conf, req, state, cached)
    end
    local steps = state.steps or NONE
    if steps.one_in_flight then
        for _, e in ipairs(entries) do
            if e.rule.one_in_flight then
                local busy, ferr = self:one_in_flight(state, e)
                if ferr then
                    return self:redis_failed(req, state, ferr)
                end
                if busy then
                    answer.rate_headers(conf, state, busy)
                    return answer.refuse_with(conf, req, state, busy)
                end
            end
        end
    end
    return self:round_trip(req, state)
end

--- Access phase, every entry known: one round trip with their commands
--- (step 4).
function Engine:round_trip(req, state)
    local conf, entries = self.conf, state.entries
    hotpath.each(entries, plan, conf, state)
    local cmds = state.cmds
    if not cmds then
        -- every entry decided here
        return self:decided(req, state, NONE)
    end
    local sent = sent_entries(state)
    -- the route's Redis budget (routes[i].timeout_ms), else redis.timeout_ms
    local res, err = commands.pipeline(state.route.store_conf or conf, cmds)
    if not res then
        return self:redis_failed(req, state, err)
    end
    -- (the round trip resumes this phase in LuaJIT's interpreter: the rest
    -- in a method of its own, which it compiles from its start)
    return self:replied(req, state, sent, res)
end

--- Access phase, after the round trip: the outcomes of the `sent`
--- entries from their replies `res`, then decided.
function Engine:replied(req, state, sent, res)
    local bad = hotpath.each(sent, decide, res)
    if bad then
        -- an error reply (a slot moved, ...): the others give back their charge
        limiters.compensate(self.conf, state, sent)
        return self:redis_failed(req, state, bad)
    end
    if state.steps and state.steps.probes then
        local done, perr = self:record_probes(state, sent)
        if not done then
            return self:redis_failed(req, state, perr)
        end
    end
    return self:decided(req, state, sent)
end

--- Access phase, every outcome known: the strictest one answers (a
--- refusal) or marks the request (soft); else it goes through.
function Engine:decided(req, state, sent)
    local conf, entries = self.conf, state.entries
    hotpath.each(entries, note_box, conf, state)
    local win = answer.strictest(entries)
    local keep = win and win.rule.on_refusal.keep_charges
    -- a refusal that keeps the other rules' charges shows them in RateLimit
    answer.rate_headers(conf, state,
        (not keep and win) or answer.tightest(entries, conf.binding_by_remaining) or win)
    if win and win.rule.on_refusal.action == "soft" then
        local a = win.rule.on_refusal
        state.decision, state.policy = "soft_blocked", win.name
        req.set_upstream_header(a.mark_header, a.mark_value)
        for k, v in pairs(a.headers or NONE) do
            state.headers[k] = v
        end
    elseif win then
        limiters.compensate(conf, state, sent, keep)
        return answer.refuse_with(conf, req, state, win)
    end
    state.admitted = true
    if self.upstream_headers then
        self:tell_upstream(req, state.ident)
    end
    if self.needs.delays then
        for _, e in ipairs(entries) do
            if e.outcome.state == "delayed" and e.outcome.retry_ms then
                -- shaping (limiter.delay): the points are reserved; wait for them
                state.delayed_ms = (state.delayed_ms or 0) + e.outcome.retry_ms
                ngx.sleep(e.outcome.retry_ms / 1000)
            end
        end
    end
end

--- The probes of rules counting failures (`sent`, refused): with no
--- failure left, this attempt counts as one, which trips the box (a
--- second round trip, only for such attempts). True, or nil and the Redis
--- error.
function Engine:record_probes(state, sent)
    local record = {}
    for _, e in ipairs(sent) do
        if e.probe and e.outcome.state == "refused" and e.params.strikes then
            record[#record + 1] = e
        end
    end
    if #record == 0 then
        return true
    end
    local rc = {}
    for i, e in ipairs(record) do
        rc[i] = limiters.failure_offence_command(e)
    end
    local res, err = commands.pipeline(state.route.store_conf or self.conf, rc)
    if not res then
        return nil, err
    end
    for i, e in ipairs(record) do
        local o = limiters.KINDS.window.outcome(e, res[i])
        if o and o.state == "boxed" then
            e.outcome = o
        end
    end
    return true
end

--- Header filter: the fields decided in the access phase. A rule that
--- counts failures, binding RateLimit, shows the failure this response
--- is about to record (r consistent with the next decision).
function Engine:header_filter(req)
    local state = req.ctx().rl
    if state and self.needs.settles then
        settle.header_filter(state)
    end
    if not state or self.conf.shadow then
        return
    end
    local e, b = state.binding_entry, state.binding
    if state.admitted and e and b and e.rule.count == "failures" and e.rule.fail_set[req.status()] then
        -- the failure being recorded counts for a whole window from now
        local next_binding = { name = b.name, limit = b.limit,
                        remaining = math.max(b.remaining - e.cost, 0),
                        reset_ms = b.window * 1000, window = b.window, clamp = true }
        headers.ratelimit_field(state.headers, self.conf, next_binding)
    end
    phases.send_headers(req, state)
end

--- Body filter: the usage of post-paid rules read from the response
--- (resty.rl.limit.settle).
function Engine:body_filter(req)
    local state = req.ctx().rl
    if state and state.usage then
        settle.body_filter(state)
    end
end

--- Log phase: counters, one structured line per refusal, and the work
--- after the response (resty.rl.decide.log_phase); a request with nothing left
--- to do gives its entries back (resty.rl.decide.matching.release).
function Engine:log(req)
    local done = log_phase.log(self.conf, req)
    if done then
        matching.release(done)
    end
end

return _M
