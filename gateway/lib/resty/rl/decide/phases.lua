-- resty.rl.decide.phases: the request plumbing of resty.rl.decide.engine: the state of
-- a request, refusals in shadow mode, a Redis failure counted and failing
-- closed, the one-attempt lease of a login, the header filter, and the
-- log phase's counters, event line and after-response timer.

local request = require "resty.rl.request.fields"
local commands = require "resty.rl.redis.commands"
local metrics = require "resty.rl.observe.metrics"
local deny = require "resty.rl.limit.deny"
local hotpath = require "resty.rl.base.hotpath"
local new_table = hotpath.new_table

local _M = {}

--- Interval of the polls of a one-attempt lease (acquire_waiting).
_M.ATTEMPT_POLL_MS = 20

--- The leases of a request that holds none: shared, so never written
--- (resty.rl.decide.phases.add_lease gives the request its own list).
_M.NO_LEASES = hotpath.shared_empty("lease list")

--- Records lease `lease` ({key, id}) as held by the request of `state`
--- (released after the response).
function _M.add_lease(state, lease)
    local leases = state.leases
    if leases == _M.NO_LEASES then
        leases = {}
        state.leases = leases
    end
    leases[#leases + 1] = lease
end

--- Access phase, first step: the state of the request (its route, fields
--- to send, leases held, the decision "allowed"; a rule policy's caller
--- `ident` and list `entries` when given; the form adds the rest), kept in
--- req.ctx().rl. Starts the edge deny cache's poller on first use.
---
--- One constructor with every field the allowed path sets (at most 16:
--- LuaJIT sizes the table's hash part to the next power of two), the
--- ones not known yet `false` (each reader tests them for truth; the
--- event lines leave them out): a field added to a table later costs
--- LuaJIT a call that resizes or rehashes it. A refusal's fields (its
--- policy, cost, strikes) are added when it is decided.
function _M.start(conf, req, ident, entries)
    deny.ensure_poller(conf)
    -- without routes every request has the default route: no path to read
    local route = conf.routes[1] and request.match_route(conf, req.method(), req.path())
        or conf.default_route
    local state = { route = route, headers = new_table(0, 2), leases = _M.NO_LEASES,
                    decision = "allowed", ident = ident or false,
                    tier_name = ident and ident.attrs.tier or false, entries = entries,
                    request_id = false, request_id_of = req.request_id, binding = false,
                    binding_entry = false, admitted = false, cmds = false, sent = false,
                    steps = false }
    req.ctx().rl = state
    return state
end

--- The request id of the request of `state`, read on first use (most
--- requests need none: nginx makes it on first read, about 7,000
--- instructions of random bytes) and kept in state.request_id. A plain
--- function, not an __index on the state: with a metatable every read
--- of a field the state lacks (state.boxed, ...) would call it.
function _M.request_id(state)
    local id = state.request_id
    if not id then
        id = state.request_id_of()
        state.request_id = id
    end
    return id
end

--- A refusal with `status`, counted as `decision`. True when the response
--- is to be sent; false in shadow mode, where the request goes through as
--- "shadow_allowed" without rate-limit fields and `decision` is only logged
--- (would_be).
function _M.refusing(conf, state, status, decision)
    state.status_would_be = status
    if conf.shadow then
        state.decision, state.would_be, state.headers = "shadow_allowed", decision, {}
        return false
    end
    state.decision = decision
    return true
end

--- Sends a refusal's body (`ctype`, `body`) with the fields decided so far.
function _M.exit(req, state, status, ctype, body)
    state.headers["Content-Type"] = ctype
    return req.exit(status, body, state.headers)
end

--- Redis failed (an error, or slower than the budget): counted, and kept
--- for the request's event line.
function _M.redis_error(conf, state, err)
    metrics.redis_error(conf, err)
    state.redis_error = err
end

--- A route failing closed while Redis fails: the fields of its 503
--- (Retry-After only: there is no live RateLimit to give). Returns the
--- wait in seconds and the refusal's detail.
function _M.fail_closed(conf, state)
    local wait = conf.fail_closed_retry_after
    state.headers = { ["Retry-After"] = tostring(wait) }
    state.retry_after = wait
    return wait, "The rate limiter is unavailable and this route fails closed; retry in "
        .. wait .. " s."
end

--- RL.LEASE ACQUIRE of a one-attempt lease (max 1) with the lease id `id`;
--- while another attempt holds it, polls every ATTEMPT_POLL_MS up to
--- `wait_ms` (the previous attempt's lease is released just after its
--- response: a client retrying at once waits for it rather than being
--- refused). Returns the last reply (granted or not), or nil and an error.
function _M.acquire_waiting(conf, key, ttl, id, wait_ms)
    local waited = 0
    while true do
        local res, err = commands.acquire(conf, key, 1, ttl, id)
        if not res or res.granted or waited >= wait_ms then
            return res, err
        end
        ngx.sleep(_M.ATTEMPT_POLL_MS / 1000)
        waited = waited + _M.ATTEMPT_POLL_MS
    end
end

--- Header filter: sets the fields decided for the response. Up to two
--- (the allowed path's RateLimit-Policy and RateLimit) without a loop: a
--- loop here keeps LuaJIT from compiling the header filter.
function _M.send_headers(req, state)
    local h = state.headers
    local k1 = next(h)
    local k2 = k1 ~= nil and next(h, k1) or nil
    if k2 == nil or next(h, k2) == nil then
        if k1 ~= nil then
            req.set_header(k1, h[k1])
        end
        if k2 ~= nil then
            req.set_header(k2, h[k2])
        end
        return
    end
    for k, v in pairs(h) do
        req.set_header(k, v)
    end
end

--- After-response work that failed on Redis: counted, and warned of
--- ("rl: <what>: <err>") with `warn`.
function _M.work_failed(conf, warn, what, err)
    metrics.redis_error(conf, err)
    warn("rl: " .. what .. ": " .. tostring(err))
end

--- Runs `work(premature, ...)` after the response, in a timer (the log
--- phase cannot use cosockets); warns when it cannot be scheduled.
function _M.after(req, work, ...)
    local ok, err = ngx.timer.at(0, work, ...)
    if not ok then
        req.warn("rl: cannot schedule the after-response work: " .. tostring(err))
    end
end

return _M
