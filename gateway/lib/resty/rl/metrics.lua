-- resty.rl.metrics: counters in a lua_shared_dict (shared by the workers)
-- and their Prometheus text exposition.
--
--   rl_gateway_requests_total{decision, route, tier}
--   rl_gateway_redis_errors_total{kind}      (timeout, refused, error)
--   rl_gateway_redis_redirects_total{kind}   (moved, ask: Redis Cluster)
--
-- decision is one of: allowed, invalid, throttled, boxed, locked_out, conflict,
-- unauthenticated, degraded_allowed, degraded_throttled, failed_closed,
-- shadow_allowed (would have been refused; let through in shadow mode).

local _M = {}

local SEP = "\1"

local function dict(conf)
    return conf.metrics_dict and ngx.shared[conf.metrics_dict]
end

-- The counter names of decisions, by decision, route and tier (all three
-- from the configuration or this file: a bounded set), made once each.
local decision_keys = {}

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
    d:incr(key, 1, 0)
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

--- Content handler for a /metrics location.
function _M.serve(dict_name)
    ngx.header["Content-Type"] = "text/plain; version=0.0.4"
    ngx.print(_M.render(dict_name or "rl_metrics"))
end

return _M
