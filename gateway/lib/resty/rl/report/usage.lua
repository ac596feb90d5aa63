-- resty.rl.report.usage: the usage dashboard of the calling API key, never
-- another's (the rules scoped by the key's attributes; for the tier form
-- its key and tenant buckets).
--
--   GET /_rl/usage      JSON: live requests per second, burst used and
--                       left, the monthly quota used and its limit, the
--                       predicted exhaustion at the current rate, recent
--                       refusals by reason, the box state, every policy
--   GET /_rl/dashboard  one HTML page (inline JS and SVG, no CDN) that
--                       polls /_rl/usage with the key and charts it
--
-- Where the numbers come from:
--   * Redis, read only: `RL.TAKE ... COST 0` (buckets), `RL.WINDOW ...
--     COST 0`, `RL.QUOTA ... COST 0` (probes that write nothing),
--     `RL.LEASE LIST` and `RL.BOX STATUS`, one pipelined round trip per
--     usage request;
--   * the per-day counters of a WEEK or MONTH quota: its command counts
--     each request's points in one more key, `<quota key>:day=YYYY-MM-DD`
--     (an ALSO clause of the same RL.QUOTA, same hash slot, expiring with
--     the period: at most 31 keys per quota key), read by one probe per
--     day of the period so far;
--   * a bucket rule with `allowance.home` (a region's allowance): its probe
--     reads the home region's Redis, where the bucket lives;
--   * a quota counted per region (`region = true`): its probes carry
--     `REGION` too, so they read the total of every region's component
--     (as of the last sync, docs/regions.md);
--   * this nginx node's counters of the key (resty.rl.observe.usage_counts,
--     counted in the log phase of ordinary requests); a report waits for
--     the counts of the requests before it.
--     Ordinary requests send nothing more to Redis. Usage reports are
--     capped per key and node (usage.reports_per_second, one more incr).

local identity = require "resty.rl.request.identity"
local matching = require "resty.rl.decide.matching"
local limiters = require "resty.rl.limit.limiters"
local request = require "resty.rl.request.fields"
local problem = require "resty.rl.format.problem"
local commands = require "resty.rl.redis.commands"
local metrics = require "resty.rl.observe.metrics"
local usage_counts = require "resty.rl.observe.usage_counts"
local cjson = require "cjson.safe"

local _M = {}

local SEP, SERIES, REFUSAL_MINUTES = usage_counts.SEP, usage_counts.SERIES, usage_counts.REFUSAL_MINUTES
-- the "live" rate: requests in the last LIVE seconds, this one included
local LIVE = 10

-- Identity attributes a usage report may be keyed by: a rule scoped by
-- anything else (client IP, a header, an argument, the login subject) is
-- not the key's own and is not shown.
local KEY_ATTRS = { key_id = true, tenant = true, tier = true, brand = true, user = true }

-- The API key header (identity.api_key; the tier form's is translated there).
local function key_header(conf)
    return conf.identity.api_key.header
end

local function sum(list, from)
    local n = 0
    for i = from, #list do
        n = n + list[i]
    end
    return n
end

--- The read-only commands of one entry (a rule applied to the caller):
--- one probe per bucket of the rule, and the box status of its first key
--- (`days`: the dates whose per-day counters are read).
function _M.probes(e, days)
    local p, cmds = e.params, {}
    local keys = { { key = e.key, name = e.name, p = p } }
    for i, a in ipairs(p.also or {}) do
        keys[#keys + 1] = { key = e.also_keys[i], name = e.also_names[i], p = a }
    end
    for _, k in ipairs(keys) do
        local q = k.p
        if p.kind == "bucket" then
            k.cmd = { "RL.TAKE", k.key, q.burst, q.rate, q.period, "COST", 0 }
        elseif p.kind == "window" then
            k.cmd = { "RL.WINDOW", k.key, q.limit, q.window, "COST", 0 }
            if p.mode == "exact" then
                k.cmd[#k.cmd + 1] = "EXACT"
            elseif p.mode == "fixed" then
                k.cmd[#k.cmd + 1] = "FIXED"
            end
        elseif p.kind == "quota" then
            k.cmd = { "RL.QUOTA", k.key, q.limit, q.period, "COST", 0, p.region and "REGION" or nil }
        else
            k.cmd = { "RL.LEASE", "LIST", k.key }
        end
        cmds[#cmds + 1] = k.cmd
    end
    if p.strikes then
        cmds[#cmds + 1] = { "RL.BOX", "STATUS", e.key }
    end
    if e.day_key then
        for _, date in ipairs(days) do
            cmds[#cmds + 1] = { "RL.QUOTA", limiters.day_key(e.key, date), limiters.DAY_LIMIT,
                                p.period, "COST", 0, p.region and "REGION" or nil }
        end
    end
    return keys, cmds
end

-- The start of the current calendar period (UTC) at `now`, and the
-- dates (YYYY-MM-DD) of its days so far.
local function period_days(period, now)
    local t = os.date("!*t", now)
    local into = t.hour * 3600 + t.min * 60 + t.sec
    if period == "MONTH" then
        into = into + (t.day - 1) * 86400
    elseif period == "WEEK" then
        -- wday: Sunday is 1; an ISO week starts on Monday
        into = into + ((t.wday + 5) % 7) * 86400
    end
    local start, days = now - into, {}
    for day = start, now, 86400 do
        days[#days + 1] = os.date("!%Y-%m-%d", day)
    end
    return start, days
end

-- The points of each day of the period from the day probes' replies.
local function day_counts(days, res, first)
    local out = {}
    for i, date in ipairs(days) do
        local d = commands.decode(res[first + i - 1])
        if not d then
            return nil, "unexpected reply to a day's probe"
        end
        out[i] = { date = date, used = math.max(d.limit - d.remaining, 0) }
    end
    return out
end

-- One policy of the report from a probe reply, or nil, error.
local function policy_report(e, k, raw, now)
    local kind = e.params.kind
    local out = { name = k.name, kind = kind, unit = e.rule.unit }
    if kind == "lease" then
        if type(raw) ~= "table" or raw[1] == false then
            return nil, "unexpected reply to RL.LEASE LIST"
        end
        out.limit, out.used = k.p.max, #raw
        out.left = math.max(out.limit - out.used, 0)
        return out
    end
    local d = commands.decode(raw)
    if not d then
        return nil, "unexpected reply: " .. tostring(type(raw) == "table" and raw[2] or raw)
    end
    out.limit = d.limit
    out.left = math.max(d.remaining, 0)
    out.used = math.max(d.limit - out.left, 0)
    out.boxed = d.status == -1
    if kind == "bucket" then
        out.period_seconds, out.refill = k.p.period, k.p.rate
        out.full_in_seconds = d.reset_ms and d.reset_ms / 1000 or cjson.null
    elseif kind == "window" then
        out.window_seconds = k.p.window
    else
        out.period = k.p.period
        out.resets_at = problem.timestamp(now + (d.reset_ms or 0) / 1000)
        out.resets_in_seconds = math.ceil((d.reset_ms or 0) / 1000)
        -- the cost of one request, when every request pays the same
        if e.rule.count == "requests" and type(e.rule.cost) == "number" then
            out.cost = e.rule.cost
        end
    end
    return out
end

-- The box of an entry from its RL.BOX STATUS reply.
local function box_report(e, raw, now)
    if type(raw) ~= "table" or #raw ~= 4 or type(raw[1]) ~= "number" then
        return nil
    end
    local b = { policy = e.name, level = raw[1], offenses = raw[3], strikes = raw[4],
                threshold = e.params.strikes.threshold }
    if raw[1] == 0 then
        b.state = "none"
    elseif raw[2] < 0 then
        b.state, b.manual = "boxed", true
    else
        b.state = "boxed"
        b.retry_after_seconds = math.ceil(raw[2] / 1000)
        b.ends_at = problem.timestamp(math.ceil(now + raw[2] / 1000))
    end
    return b
end

-- The tightest of `list` (smallest share left) among policies of `kind`
-- that pass `want`.
local function tightest(list, kind, want)
    local best, share
    for _, p in ipairs(list) do
        if p.kind == kind and (not want or want(p)) then
            local s = p.left / math.max(p.limit, 1)
            if not share or s < share then
                best, share = p, s
            end
        end
    end
    return best
end

-- The predicted exhaustion of quota `q` at its average rate since the
-- period started (per-day counters kept): points a day and the date, or null.
local function forecast(q, start, now)
    if q.kind ~= "quota" or q.used <= 0 then
        return cjson.null
    end
    local per_second = q.used / math.max(now - start, 1)
    local f = { per_day = math.floor(per_second * 86400 + 0.5) }
    if q.left <= 0 then
        f.exhausted_at = problem.timestamp(now)
    else
        local secs = math.ceil(q.left / per_second)
        f.exhausted_at = secs < q.resets_in_seconds and problem.timestamp(now + secs) or cjson.null
    end
    return f
end

-- The predicted exhaustion of quota `q` at the rate of `admitted`
-- requests in the last SERIES seconds (this node's): left / rate, in
-- whole seconds rounded up; none without traffic, or when the period
-- resets first.
local function predict(q, admitted, now)
    if q.left <= 0 then
        q.seconds_to_exhaustion, q.exhausted_at = 0, problem.timestamp(now)
        return
    end
    if not q.cost or admitted <= 0 then
        return
    end
    -- integers as far as possible: 980 left at 20 a minute is 2940 s, exactly
    local secs = math.ceil(q.left * SERIES / (admitted * q.cost))
    if secs < q.resets_in_seconds then
        q.seconds_to_exhaustion = secs
        q.exhausted_at = problem.timestamp(now + secs)
    end
end

-- A JSON answer (status, body table or string) through the adapter.
local function answer(req, status, body, ctype)
    return req.exit(status, type(body) == "string" and body or (cjson.encode(body) or "{}"), {
        ["Content-Type"] = ctype or "application/json",
        ["Cache-Control"] = "no-store",
    })
end

local function refuse(conf, req, status, kind, detail)
    return answer(req, status, problem.encode(conf, kind, status, { detail = detail }),
        problem.CONTENT_TYPE)
end

-- The content handler (gw, req) of a usage endpoint (`what`: report,
-- dashboard): `handler(gw, req, conf)`, or a 404 when the policy has
-- `usage = false`.
local function unless_off(what, handler)
    return function(gw, req)
        local conf = gw.conf
        if not conf.usage then
            return refuse(conf, req, 404, "not-found", "No usage " .. what .. " on this gateway.")
        end
        return handler(gw, req, conf)
    end
end

--- The caller, authenticated by its API key alone (JWTs and auth-layer
--- headers are not read: this location may not sit behind that layer;
--- the adapter handed to the identity has no other header),
--- or nil, status, problem kind, detail.
function _M.caller(conf, req)
    local hname = key_header(conf)
    local key = request.credential(req, hname)
    if not key then
        return nil, 401, "unauthenticated", "Send your API key, once, in " .. hname .. "."
    end
    local function only_the_key(name)
        if name:lower() == hname:lower() then
            return key
        end
    end
    local only_key = setmetatable({ header = only_the_key, header_values = only_the_key },
        { __index = req })
    -- JWTs and auth-layer headers read nothing: the wrapper has only the key
    local ident = identity.resolve(conf, only_key)
    if not ident then
        return nil, 503, "rate-limiter-unavailable", "The identity store is unavailable: " ..
            "retry later."
    end
    if not ident.authenticated then
        return nil, 401, "unauthenticated", ident.refused == "revoked" and "This API key is revoked."
            or "Unknown API key."
    end
    return ident
end

-- The entries of a caller: its rules scoped by key attributes only, as
-- resty.rl.decide.engine builds them (probe cost aside); not those left out of
-- RateLimit-Policy (`policy_header = false`: the tier form's leases).
local function rule_entries(gw, req, ident)
    local conf, entries = gw.conf, {}
    local state = { route = conf.default_route }
    for _, rule in ipairs(conf.rules) do
        local own = rule.policy_header ~= false
        for _, a in ipairs(rule.scope) do
            own = own and KEY_ATTRS[a] ~= nil
        end
        for _, a in ipairs(rule.limiter.also or {}) do
            for _, s in ipairs(a.scope or {}) do
                own = own and KEY_ATTRS[s] ~= nil
            end
        end
        -- the cost does not matter to a probe: never read it from this request
        local e = own and matching.entry(gw.conf, req, state,
            setmetatable({ cost = 1 }, { __index = rule }), ident)
        if e then
            e.rule = rule
            entries[#entries + 1] = e
        end
    end
    return entries
end

--- The usage report of the caller `ident` under gateway `gw` (a rule
--- policy's engine), or nil, error.
function _M.report(gw, req, ident)
    local conf = gw.conf
    -- one pipeline per Redis: the policy's, and the home region's of each
    -- rule with allowance.home (its bucket lives there only)
    local groups, by_conf, entries = {}, {}, {}
    local today = ngx.time()
    for _, e in ipairs(rule_entries(gw, req, ident)) do
        local start, days
        if e.day_key then
            start, days = period_days(e.params.period, today)
        end
        local target = e.rule.allowance and e.rule.allowance.home_conf or conf
        local g = by_conf[target]
        if not g then
            g = { conf = target, cmds = {} }
            by_conf[target] = g
            groups[#groups + 1] = g
        end
        local cmds = g.cmds
        local keys, c = _M.probes(e, days)
        entries[#entries + 1] = { e = e, keys = keys, first = #cmds + 1, start = start, g = g,
                                  days = days, days_first = #cmds + #c - #(days or {}) + 1 }
        for _, cmd in ipairs(c) do
            cmds[#cmds + 1] = cmd
        end
    end
    local err
    for _, g in ipairs(groups) do
        g.res, err = commands.pipeline(g.conf, g.cmds)
        if not g.res then
            return nil, err
        end
    end
    ngx.update_time()
    local now = ngx.now()
    -- an empty list is a JSON array where the encoder can say so (OpenResty's cjson)
    local policies, box = setmetatable({}, cjson.empty_array_mt), nil
    for _, x in ipairs(entries) do
        local res = x.g.res
        local own_first = #policies + 1
        for i, k in ipairs(x.keys) do
            local p, perr = policy_report(x.e, k, res[x.first + i - 1], now)
            if not p then
                return nil, perr
            end
            policies[#policies + 1] = p
        end
        if x.e.params.strikes then
            local b = box_report(x.e, res[x.first + #x.keys], now)
            if b and (not box or b.level > box.level or b.manual) then
                box = b
            end
            -- the penalty state lives on the rule's first key
            policies[own_first].box = b
        end
        if x.days then
            local p = policies[own_first]
            p.days, err = day_counts(x.days, res, x.days_first)
            if not p.days then
                return nil, err
            end
            p.started_at, p.forecast = problem.timestamp(x.start), forecast(p, x.start, now)
        end
    end
    local a = ident.attrs
    local out = { key_id = a.key_id, tenant = a.tenant, tier = a.tier,
                  now = problem.timestamp(now), policies = policies }
    local d = usage_counts.dict(conf)
    local sec = math.floor(now)
    local admitted_60s = 0
    if d and a.key_id then
        -- the workers' counts of the requests before this one
        metrics.await(d)
        local admitted, refused, by_reason, total = usage_counts.counters(d, conf.key_prefix, a.key_id, sec)
        local live = sum(admitted, SERIES - LIVE + 1) + sum(refused, SERIES - LIVE + 1)
        admitted_60s = sum(admitted, 1)
        out.rate = { requests_per_second = live / LIVE, window_seconds = LIVE,
                     admitted_per_second_60s = admitted_60s / SERIES, node = true,
                     series = { seconds = SERIES, ends_at = sec, admitted = admitted,
                                refused = refused } }
        out.refusals = { window_seconds = REFUSAL_MINUTES * 60, total = total,
                         by_reason = by_reason }
    else
        out.rate, out.refusals = cjson.null, cjson.null
    end
    local burst = tightest(policies, "bucket")
    out.burst = burst and { policy = burst.name, limit = burst.limit, used = burst.used,
                            left = burst.left } or cjson.null
    for _, p in ipairs(policies) do
        if p.kind == "quota" then
            predict(p, admitted_60s, now)
        end
    end
    local quota = tightest(policies, "quota", function(p) return p.period == "MONTH" end)
        or tightest(policies, "quota")
    if quota then
        out.quota = { policy = quota.name, period = quota.period, limit = quota.limit,
                      used = quota.used, left = quota.left, resets_at = quota.resets_at,
                      resets_in_seconds = quota.resets_in_seconds,
                      seconds_to_exhaustion = quota.seconds_to_exhaustion or cjson.null,
                      exhausted_at = quota.exhausted_at or cjson.null,
                      started_at = quota.started_at or cjson.null,
                      days = quota.days or cjson.null,
                      forecast = quota.forecast or cjson.null }
    else
        out.quota = cjson.null
    end
    out.box = box or { state = "none" }
    return out
end

--- content_by_lua of GET /_rl/usage: the caller's usage as JSON.
_M.serve = unless_off("report", function(gw, req, conf)
    if req.method() ~= "GET" and req.method() ~= "HEAD" then
        return refuse(conf, req, 405, "method-not-allowed", "GET only.")
    end
    local ident, status, kind, detail = _M.caller(conf, req)
    if not ident then
        return refuse(conf, req, status, kind, detail)
    end
    -- reports cost Redis round trips: at most reports_per_second per key and node
    local d, key_id = usage_counts.dict(conf), ident.attrs.key_id
    if d and key_id then
        local n = d:incr("u" .. SEP .. conf.key_prefix .. SEP .. key_id .. SEP .. ngx.time(), 1, 0, 2)
        if n and n > conf.usage.reports_per_second then
            return req.exit(429, problem.encode(conf, "rate-limit-exceeded", 429, {
                detail = "At most " .. conf.usage.reports_per_second .. " usage reports a second.",
                retry_after_seconds = 1 }), { ["Content-Type"] = problem.CONTENT_TYPE,
                ["Retry-After"] = "1", ["Cache-Control"] = "no-store" })
        end
    end
    local out, err = _M.report(gw, req, ident)
    if not out then
        ngx.log(ngx.WARN, "rl: usage report failed: ", tostring(err))
        return refuse(conf, req, 503, "rate-limiter-unavailable",
            "The rate limiter is unavailable; retry later.")
    end
    local json = (cjson.encode(out) or "{}"):gsub("\\/", "/")
    return answer(req, 200, json)
end)

-- The dashboard page (dashboard.html, next to this file), read when the
-- library is loaded (init_by_lua: nginx's workers run as another user,
-- who may not read the library's directory); a page that cannot be read
-- stops nginx from starting, the path named.
local page
do
    local here = package.searchpath("resty.rl.report.usage", package.path)
    local path = here and here:gsub("usage%.lua$", "dashboard.html") or "dashboard.html"
    local f, err = io.open(path, "rb")
    page = f and f:read("*a")
    if f then
        f:close()
    end
    if not page then
        error("rl: cannot read the usage dashboard's page " .. path .. ": " .. tostring(err))
    end
end

--- content_by_lua of GET /_rl/dashboard: the page (no key needed to load
--- it; its script asks for the key and sends it in the API key header).
_M.dashboard = unless_off("dashboard", function(_, req, conf)
    -- the header name as a JS string literal (a replacement string: % doubled)
    local header = (cjson.encode(key_header(conf)) or '"X-Api-Key"'):gsub("%%", "%%%%")
    local html = page:gsub("__API_KEY_HEADER__", header)
    return req.exit(200, html, {
        ["Content-Type"] = "text/html; charset=utf-8",
        ["Cache-Control"] = "no-store",
        ["Referrer-Policy"] = "no-referrer",
        ["X-Content-Type-Options"] = "nosniff",
        ["Content-Security-Policy"] = "default-src 'none'; script-src 'unsafe-inline'; "
            .. "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
            .. "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    })
end)

return _M
