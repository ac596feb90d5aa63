-- resty.rl.observe.metrics: counters in a lua_shared_dict (shared by the workers)
-- and their Prometheus text exposition.
--
--   rl_gateway_requests_total{decision, route, tier}
--   rl_gateway_redis_errors_total{kind}      (timeout, refused, error)
--   rl_gateway_redis_redirects_total{kind}   (moved, ask: Redis Cluster)
--
-- decision is one of: allowed, invalid, throttled, boxed, locked_out, conflict,
-- unauthenticated, degraded_allowed, degraded_throttled, failed_closed,
-- shadow_allowed (would have been refused; let through in shadow mode).
--
-- Decisions are counted per worker and added to the dict by a timer at
-- most FLUSH_S later (one shared-dict `incr` per counter and flush, not
-- one per request: the dict's lock is shared by the workers). While a
-- worker holds counts not yet added, its mark `\1pending\1<pid>` in the
-- dict says since when; serve() waits (at most SERVE_WAIT_S) until no
-- worker holds counts from before the scrape, so that /metrics counts
-- every request logged before it was asked. render() reads the dict as
-- it is. add() and await() are the same for other dicts' counters (the
-- usage dashboard's, resty.rl.report.usage).

local _M = {}

local SEP = "\1"

local function dict(conf)
    return conf.metrics_dict and ngx.shared[conf.metrics_dict]
end

-- The counter names of decisions, by decision, route and tier (all three
-- from the configuration or this file: a bounded set), made once each.
local decision_keys = {}

-- How long a worker keeps its decision counts before adding them to the
-- dict; how long serve() waits for the workers' counts at the most; how
-- long a worker's mark outlives it (a worker that died with counts).
local FLUSH_S = 0.05
local SERVE_WAIT_S = 1
local MARK_TTL_S = 5
local PENDING_MARK = SEP .. "pending" .. SEP

-- This worker's counts not yet in the dict: per dict, by counter name;
-- and the expiry (seconds) of the counters created with one.
local pending, pending_ttl = {}, {}

local function mark_name()
    return PENDING_MARK .. ngx.worker.pid()
end

-- Adds this worker's counts for `d` to it (also when the worker exits:
-- `premature`), then clears its mark.
local function flush(_premature, d)
    local p, ttl = pending[d], pending_ttl[d]
    pending[d], pending_ttl[d] = nil, nil
    for key, n in pairs(p or {}) do
        d:incr(key, n, 0, ttl and ttl[key])
    end
    d:delete(mark_name())
end

-- The first count since the last flush: the mark (since when) and the
-- flush FLUSH_S later. False when no timer can be had (lua_max_pending_timers).
local function schedule_flush(d)
    d:set(mark_name(), ngx.now(), MARK_TTL_S)
    if ngx.timer.at(FLUSH_S, flush, d) then
        return true
    end
    d:delete(mark_name())
    return false
end

--- Counts one decision on `route` for `tier`.
function _M.decision(conf, decision, route, tier)
    local d = dict(conf)
    if not d then
        return
    end
    tier = tier or "none"
    local by_route = decision_keys[decision]
    if not by_route then
        by_route = {}
        decision_keys[decision] = by_route
    end
    local by_tier = by_route[route]
    if not by_tier then
        by_tier = {}
        by_route[route] = by_tier
    end
    local key = by_tier[tier]
    if not key then
        key = "req" .. SEP .. decision .. SEP .. route .. SEP .. tier
        by_tier[tier] = key
    end
    _M.add(d, key, 1)
end

--- Adds `n` to the counter `key` of shared dict `d` (made with the
--- expiry `ttl` seconds when it is new and `ttl` is given): counted in
--- this worker and added to the dict at most FLUSH_S later.
function _M.add(d, key, n, ttl)
    local p = pending[d]
    if not p then
        if not schedule_flush(d) then
            -- no flush to come: counted at once
            d:incr(key, n, 0, ttl)
            return
        end
        p = {}
        pending[d] = p
    end
    p[key] = (p[key] or 0) + n
    if ttl then
        local t = pending_ttl[d]
        if not t then
            t = {}
            pending_ttl[d] = t
        end
        t[key] = ttl
    end
end

--- Counts one failed Redis call, by kind of failure.
function _M.redis_error(conf, err)
    local d = dict(conf)
    if not d then
        return
    end
    local kind = "error"
    if err and err:find("timeout", 1, true) then
        kind = "timeout"
    elseif err and (err:find("refused", 1, true) or err:find("closed", 1, true)) then
        kind = "refused"
    end
    d:incr("err" .. SEP .. kind, 1, 0)
end

--- Counts one cluster redirection (kind "MOVED" or "ASK"); `conf` is
--- a configuration or its `redis` table (both carry metrics_dict).
function _M.redirect(conf, kind)
    local d = dict(conf)
    if d then
        d:incr("redir" .. SEP .. kind:lower(), 1, 0)
    end
end

local function label(v)
    return (v:gsub('[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

--- The Prometheus text exposition (version 0.0.4) of the counters in
--- the shared dict `dict_name`.
function _M.render(dict_name)
    local d = ngx.shared[dict_name]
    local req, err, redir = {}, {}, {}
    if d then
        for _, k in ipairs(d:get_keys(0)) do
            local v = d:get(k) or 0
            local parts = {}
            for p in (k .. SEP):gmatch("(.-)" .. SEP) do
                parts[#parts + 1] = p
            end
            if parts[1] == "req" then
                req[#req + 1] = string.format(
                    'rl_gateway_requests_total{decision="%s",route="%s",tier="%s"} %d',
                    label(parts[2]), label(parts[3]), label(parts[4]), v)
            elseif parts[1] == "redir" then
                redir[#redir + 1] = string.format('rl_gateway_redis_redirects_total{kind="%s"} %d',
                    label(parts[2]), v)
            elseif parts[1] == "err" then
                err[#err + 1] = string.format('rl_gateway_redis_errors_total{kind="%s"} %d',
                    label(parts[2]), v)
            end
        end
    end
    table.sort(req)
    table.sort(err)
    table.sort(redir)
    return table.concat({
        "# HELP rl_gateway_requests_total Rate-limit decisions of the gateway.",
        "# TYPE rl_gateway_requests_total counter",
        table.concat(req, "\n"),
        "# HELP rl_gateway_redis_errors_total Failed or too slow calls to Redis.",
        "# TYPE rl_gateway_redis_errors_total counter",
        table.concat(err, "\n"),
        "# HELP rl_gateway_redis_redirects_total Redis Cluster redirections followed.",
        "# TYPE rl_gateway_redis_redirects_total counter",
        table.concat(redir, "\n"),
    }, "\n"):gsub("\n\n+", "\n") .. "\n"
end

-- Polls of await() (every POLL_S, SERVE_WAIT_S in all).
local POLL_S = 0.005

-- True when a worker holds counts for `d` from `asked` or before.
local function held_since(d, asked)
    for _, k in ipairs(d:get_keys(0)) do
        if k:sub(1, #PENDING_MARK) == PENDING_MARK then
            local since = d:get(k)
            if since and since <= asked then
                return true
            end
        end
    end
    return false
end

--- Waits (at most SERVE_WAIT_S) until every worker has added to dict `d`
--- the counts it held when asked (add()): each does within FLUSH_S.
function _M.await(d)
    ngx.update_time()
    local asked = ngx.now()
    for _ = 1, math.ceil(SERVE_WAIT_S / POLL_S) do
        if not held_since(d, asked) then
            return
        end
        ngx.sleep(POLL_S)
    end
end

--- Content handler for a /metrics location: the counters once every
--- worker has added the decisions it counted before the scrape.
function _M.serve(dict_name)
    dict_name = dict_name or "rl_metrics"
    local d = ngx.shared[dict_name]
    if d then
        _M.await(d)
    end
    ngx.header["Content-Type"] = "text/plain; version=0.0.4"
    ngx.print(_M.render(dict_name))
end

return _M
