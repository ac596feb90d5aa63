-- resty.rl.policy.rules: the rule policy (a configuration with `rules`), its
-- validation and compilation. A policy is a list of rules; each names what
-- it matches, whom it counts (its scope: identity attributes), its limiter
-- and the options of that limiter's command, its cost, and what a refusal
-- answers. gateway/REFERENCE.md ("Rule policies") documents every field.
--
-- Values that depend on the caller are references, resolved per request
-- (resty.rl.decide.engine): "tier.<field>" (the caller's tier, overridden per
-- tenant by the identity store), "tenant.<field>", "brand.<field>"
-- (identity store overrides), or { ref = "...", default = v }.

local allowance = require "resty.rl.limit.allowance"
local settle = require "resty.rl.limit.settle"
local jws = require "resty.rl.request.jws"
local refs = require "resty.rl.policy.refs"

local _M = {}

local function check(cond, fmt, ...)
    if not cond then
        error("rl config: " .. string.format(fmt, ...), 0)
    end
end
_M.check = check

local function positive_int(v)
    return type(v) == "number" and v >= 1 and v == math.floor(v)
end

-- An integer percent from 0 to 100.
local function percent(v)
    return type(v) == "number" and v >= 0 and v <= 100 and v % 1 == 0
end

-- Seconds the module takes: > 0 (>= 0 with `zero_ok`), at most 100
-- years, at most 3 decimals.
local function seconds(v, zero_ok)
    if type(v) ~= "number" or v < 0 or (v == 0 and not zero_ok) or v > 3153600000 then
        return false
    end
    local ms = v * 1000
    return math.abs(ms - math.floor(ms + 0.5)) < 1e-6
end

-- Escapes Lua pattern magic characters.
local function literal(s)
    return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"))
end

--- Compiles a route template ("/v1/ledgers/{id}/entries") to an anchored
--- Lua pattern; each {name} matches one non-empty path segment.
function _M.template_pattern(template)
    local parts = {}
    local pos = 1
    while true do
        local s, e = template:find("{[%w_]+}", pos)
        if not s then
            parts[#parts + 1] = literal(template:sub(pos))
            break
        end
        parts[#parts + 1] = literal(template:sub(pos, s - 1))
        parts[#parts + 1] = "[^/]+"
        pos = e + 1
    end
    return "^" .. table.concat(parts) .. "/?$"
end

-- Attributes an API key's record gives (a key naming only these is the
-- same for every request of that record).
local RECORD_ATTRS = { key_id = true, tenant = true, brand = true, user = true }

--- A key template ("{t:<tenant>}:key:<key_id>", "...:<arg:ledger_id|->")
--- compiled: {parts = literal strings and {attr, default} items, attrs =
--- the attributes it reads, from_record = true when every attribute comes
--- from the API key's record}. `<attr>` is replaced by the attribute's
--- value (resty.rl.request.fields.key_part), `<attr|x>` by x when it has none; a
--- key whose attribute has neither does not apply to the request.
local function key_template(where, t)
    check(type(t) == "string" and t ~= "", "%s: key must be a template string", where)
    local parts, attrs, from_record, pos = {}, {}, true, 1
    while true do
        local s, e, inner = t:find("<([^<>]+)>", pos)
        if not s then
            parts[#parts + 1] = t:sub(pos)
            break
        end
        parts[#parts + 1] = t:sub(pos, s - 1)
        local attr, default = inner:match("^([^|]+)|(.*)$")
        attr = attr or inner
        parts[#parts + 1] = { attr = attr, default = default }
        attrs[#attrs + 1] = attr
        from_record = from_record and RECORD_ATTRS[attr] ~= nil and default == nil
        pos = e + 1
    end
    return { parts = parts, attrs = attrs, from_record = from_record }
end

-- Checks option `name` of `where` with `pred` for every value it takes.
local function check_opt(where, name, v, tiers, pred, what)
    local values, err = refs.each_value(v, tiers)
    check(values, "%s", err)
    for _, x in ipairs(values) do
        check(pred(x[1]), "%s: %s must be %s%s", where, name, what, x[2])
    end
end

-- Checks option `name` as check_opt does when it is given (not nil).
local function check_given(where, name, v, tiers, pred, what)
    if v ~= nil then
        check_opt(where, name, v, tiers, pred, what)
    end
end

local function strikes_ok(s)
    return s == nil or s == false or type(s) == "table" and positive_int(s.threshold)
        and seconds(s.window) and (s.every_refusal == nil or type(s.every_refusal) == "boolean")
end

local function box_ok(b)
    if b == nil then
        return true
    end
    if type(b) ~= "table" or #b ~= 3 then
        return false
    end
    for i = 1, 3 do
        if not seconds(b[i], true) then
            return false
        end
    end
    return true
end

local PERIODS = { DAY = true, WEEK = true, MONTH = true }
local MODES = { sliding = true, exact = true, fixed = true }

--- The limiter kinds and the validation of their options. Adding a kind
--- is one entry here and one in resty.rl.limit.limiters (KINDS: its command,
--- header form and outcome).
_M.KINDS = {
    bucket = function(where, l, tiers)
        check_opt(where, "rate", l.rate, tiers, positive_int, "an integer >= 1")
        check_opt(where, "burst", l.burst, tiers, positive_int, "an integer >= 1")
        l.period = l.period or 60
        check_opt(where, "period", l.period, tiers, seconds, "seconds > 0 with at most 3 decimals")
        check_given(where, "delay", l.delay, tiers, seconds, "seconds > 0 (the longest wait)")
        check_given(where, "reserve", l.reserve, tiers, percent, "an integer percent from 0 to 100")
    end,
    window = function(where, l, tiers)
        check_opt(where, "limit", l.limit, tiers, positive_int, "an integer >= 1")
        check_opt(where, "window", l.window, tiers, seconds, "seconds > 0 with at most 3 decimals")
        l.mode = l.mode or "sliding"
        check(MODES[l.mode], "%s: mode must be sliding, exact or fixed", where)
        if l.mode == "exact" then
            check_opt(where, "limit", l.limit, tiers, function(v) return v <= 10000 end,
                "at most 10000 with mode exact")
        end
    end,
    quota = function(where, l, tiers)
        check_opt(where, "limit", l.limit, tiers, positive_int, "an integer >= 1")
        check_opt(where, "period", l.period, tiers, function(v) return PERIODS[v] end,
            "DAY, WEEK or MONTH")
        -- counted per region (RL.QUOTA ... REGION): the limiter's own, for every key
        check(l.region == nil or type(l.region) == "boolean",
            "%s: region must be true or false", where)
    end,
    lease = function(where, l, tiers)
        check_opt(where, "max", l.max, tiers, function(v) return positive_int(v) and v <= 1000 end,
            "an integer from 1 to 1000")
        l.ttl = l.ttl or 300
        check_opt(where, "ttl", l.ttl, tiers, seconds, "seconds > 0")
        check_given(where, "expected", l.expected, tiers, seconds, "seconds > 0")
    end,
    -- distinct members (resty.rl.limit.distinct); `member` is checked as an attribute
    distinct = function(where, l, tiers)
        check_opt(where, "limit", l.limit, tiers,
            function(v) return positive_int(v) and v <= 10000 end, "an integer from 1 to 10000")
        check_opt(where, "window", l.window, tiers, seconds, "seconds > 0 with at most 3 decimals")
        check(l.strikes == nil and l.box == nil and l.jitter == nil,
            "%s: a distinct limiter boxes with trip = {level, duration}, not strikes/box/jitter",
            where)
        check_given(where, "trip", l.trip, tiers, function(t)
            return type(t) == "table" and positive_int(t.level) and t.level <= 3
                and seconds(t.duration, true)
        end, "{level = 1 to 3, duration = seconds >= 0 (0 = manual)}")
        if l.min_events ~= nil then
            check(l.trip ~= nil, "%s: min_events needs trip", where)
            check_opt(where, "min_events", l.min_events, tiers,
                function(v) return positive_int(v) and v >= 2 and v <= 10001 end,
                "an integer from 2 to 10001")
        end
    end,
}

local function check_penalty(where, l, tiers)
    check_opt(where, "strikes", l.strikes, tiers, strikes_ok,
        "{threshold = integer >= 1, window = seconds > 0, every_refusal = boolean} or none")
    if l.box ~= nil then
        check(l.strikes ~= nil, "%s: box needs strikes", where)
        check_opt(where, "box", l.box, tiers, box_ok, "3 durations in seconds >= 0 (0 = manual)")
    end
    check_given(where, "offenses_ttl", l.offenses_ttl, tiers, seconds, "seconds > 0")
    check_given(where, "jitter", l.jitter, tiers, percent, "an integer percent from 0 to 100")
end

local ACTIONS = {
    reject = { status = 429, type = "rate-limit-exceeded" },
    quota = { status = 403, type = "quota-exceeded" },
    challenge = { status = 401, type = "challenge-required" },
    soft = { status = nil, type = nil },
}
_M.ACTIONS = ACTIONS

local SCOPE_ATTRS = { key_id = true, tenant = true, tier = true, user = true, brand = true,
                      ip = true, subject = true, route = true }

local function check_scope(where, scope)
    check(type(scope) == "table" and #scope >= 1, "%s: scope must list attributes", where)
    for i, a in ipairs(scope) do
        check(type(a) == "string" and (SCOPE_ATTRS[a] or a:match("^header:.+")
            or a:match("^arg:.+") or a:match("^claim:.+")),
            "%s: scope[%d] %q is not an attribute (key_id, tenant, tier, user, brand, ip, "
            .. "subject, route, header:<name>, arg:<name>, claim:<name>)", where, i, tostring(a))
    end
end

local function validate_rule(i, r, conf)
    local where = "rules[" .. i .. "]"
    check(type(r) == "table", "%s must be a table", where)
    check(type(r.name) == "string" and r.name:match("^[%w_%-{}%.]+$"),
        "%s: name must be letters, digits, - _ . ({tier} is replaced by the tier)", where)
    where = where .. " (" .. r.name .. ")"
    local tiers = conf.tiers
    local m = r.match or {}
    r.match = m
    check(type(m) == "table", "%s: match must be a table", where)
    if m.path then
        check(type(m.path) == "string" and m.path:sub(1, 1) == "/",
            "%s: match.path must be a template starting with /", where)
        m.pattern = _M.template_pattern(m.path)
    end
    if m.routes then
        local known = {}
        for _, rt in ipairs(conf.routes) do
            known[rt.name] = true
        end
        known[conf.default_route.name] = true
        local set = {}
        for _, name in ipairs(m.routes) do
            check(known[name], "%s: match.routes names an unknown route %q", where, tostring(name))
            set[name] = true
        end
        m.route_set = set
    end
    r.scope = r.scope or { "key_id" }
    check_scope(where, r.scope)
    if r.key ~= nil then
        r.key_template = key_template(where, r.key)
    end
    r.tag = r.tag or r.scope[1]
    local tag_in_scope = false
    for _, a in ipairs(r.scope) do
        tag_in_scope = tag_in_scope or a == r.tag
    end
    check(tag_in_scope, "%s: tag %s must be one of the scope's attributes", where, tostring(r.tag))
    local l = r.limiter
    check(type(l) == "table" and _M.KINDS[l.kind],
        "%s: limiter.kind must be bucket, window, quota, lease or distinct", where)
    refs.compile(l)
    _M.KINDS[l.kind](where .. ".limiter", l, tiers)
    if l.kind == "distinct" then
        check(type(l.member) == "string", "%s.limiter: member must name the attribute counted "
            .. "(subject, ip, header:<name>, ...)", where)
        check_scope(where .. ".limiter.member", { l.member })
    end
    -- the attributes a request needs for the rule to apply (resty.rl.decide.engine)
    r.attrs = { unpack(r.scope) }
    r.attrs[#r.attrs + 1] = l.member
    -- the tag attribute alone: its value names the rule's key
    r.tag_only = #r.attrs == 1 and r.attrs[1] == r.tag
    if l.kind ~= "lease" then
        check_penalty(where .. ".limiter", l, tiers)
    end
    for j, a in ipairs(l.also or {}) do
        check(l.kind == "bucket" or l.kind == "window" or l.kind == "quota",
            "%s: also works with bucket, window and quota only", where)
        local aw = where .. ".limiter.also[" .. j .. "]"
        check(type(a.name) == "string", "%s: name missing", aw)
        check_scope(aw, a.scope or {})
        check(a.region == nil, "%s: region is the limiter's option (it covers every also key)", aw)
        a.kind, a.period, a.mode = l.kind, a.period or (l.kind == "bucket" and 60 or nil), l.mode
        _M.KINDS[l.kind](aw, a, tiers)
        if a.key ~= nil then
            check(r.key_template, "%s: key needs the rule's own key", aw)
            a.key_template = key_template(aw, a.key)
        end
    end
    -- cost: a number, "route" (the matched route's cost) or {arg = name}
    r.cost = r.cost == nil and 1 or r.cost
    check(r.cost == "route" or (type(r.cost) == "number" and r.cost >= 0 and r.cost % 1 == 0)
        or (type(r.cost) == "table" and type(r.cost.arg) == "string"),
        "%s: cost must be an integer >= 0, \"route\" or {arg = name}", where)
    check(r.count == nil or r.count == "requests" or r.count == "failures"
        or r.count == "response_bytes",
        "%s: count must be requests, failures or response_bytes", where)
    if r.count == "response_bytes" then
        check((l.kind == "quota" or l.kind == "window") and not l.also and not l.strikes,
            "%s: count response_bytes needs a quota or window limiter without also or strikes",
            where)
        r.cost = 1
        r.unit = r.unit or "content-bytes"
    end
    r.count = r.count or "requests"
    if r.count == "failures" then
        check((l.kind == "window" or l.kind == "distinct") and not l.also,
            "%s: count failures needs a window or distinct limiter without also", where)
        r.fail_statuses = r.fail_statuses or { 401, 403 }
        r.fail_set = {}
        for _, s in ipairs(r.fail_statuses) do
            r.fail_set[s] = true
        end
    end
    if type(r.cost) == "number" and l.kind ~= "lease" then
        local cap = l.kind == "bucket" and "burst" or "limit"
        check_opt(where, "limiter." .. cap, l[cap], tiers,
            function(v) return v >= r.cost end, "at least the cost " .. r.cost)
    end
    if r.cost == "route" and (l.kind == "bucket" or l.kind == "window") then
        local dearest = conf.default_route.cost or 1
        for _, rt in ipairs(conf.routes) do
            if not m.route_set or m.route_set[rt.name] then
                dearest = math.max(dearest, rt.cost or 1, rt.range and rt.range.cost or 0)
            end
        end
        local cap = l.kind == "bucket" and "burst" or "limit"
        check_opt(where, "limiter." .. cap, l[cap], tiers,
            function(v) return v >= dearest end, "at least the dearest route's cost " .. dearest)
    end
    allowance.validate(where, r, l, check, conf)
    settle.validate(where, r, l, check)
    -- no reference: the engine shares the limiter between callers
    r.static_limiter = not refs.has_ref(l)
    -- references to the tier only: resolved once per tier (resty.rl.decide.matching)
    r.tier_limiter = not r.static_limiter and refs.tier_only(l)
    local f = r.one_in_flight
    if f then
        check(r.count == "failures", "%s: one_in_flight needs count = failures", where)
        f.ttl, f.wait_ms, f.retry_after = f.ttl or 30, f.wait_ms or 500, f.retry_after or 1
        check(seconds(f.ttl), "%s: one_in_flight.ttl must be seconds > 0", where)
        check(type(f.wait_ms) == "number" and f.wait_ms >= 0,
            "%s: one_in_flight.wait_ms must be >= 0", where)
        check(positive_int(f.retry_after), "%s: one_in_flight.retry_after must be an integer >= 1",
            where)
    end
    r.unit = r.unit or ((r.cost == "route" or type(r.cost) == "table") and "points"
        or l.kind == "lease" and "concurrent-requests"
        or l.kind == "distinct" and "members" or "requests")
    local a = r.on_refusal or {}
    r.on_refusal = a
    a.action = a.action or (l.kind == "quota" and "quota" or "reject")
    local act = ACTIONS[a.action]
    check(act, "%s: on_refusal.action must be reject, quota, challenge or soft", where)
    a.status = a.status or act.status
    a.type = a.type or act.type
    if a.action ~= "soft" then
        check(positive_int(a.status) and a.status >= 400 and a.status <= 599,
            "%s: on_refusal.status must be an HTTP error status", where)
    else
        a.mark_header = a.mark_header or "X-RateLimit-Soft-Block"
        a.mark_value = a.mark_value or r.name
    end
    check(a.headers == nil or type(a.headers) == "table", "%s: on_refusal.headers must be a "
        .. "table", where)
    -- the decision counted for a refusal state ({boxed = "locked_out"})
    check(a.decisions == nil or type(a.decisions) == "table",
        "%s: on_refusal.decisions must be a table", where)
    -- a policy built in Lua may describe its refusals itself (the tier
    -- form: resty.rl.policy.tier_form): describe(e, outcome, secs, name) -> detail, tier
    check(a.describe == nil or type(a.describe) == "function",
        "%s: on_refusal.describe must be a function", where)
    if r.on_redis_failure ~= nil then
        r.on_redis_failure = refs.as_ref(r.on_redis_failure) or r.on_redis_failure
        check_opt(where, "on_redis_failure", r.on_redis_failure, tiers, function(v)
            return v == "local" or v == "open" or v == "closed"
        end, "local, open or closed")
    end
    if r.quota_alerts ~= nil then
        local qa = r.quota_alerts
        check(l.kind == "quota" and r.count ~= "failures" and type(qa) == "table"
            and type(qa.thresholds) == "table" and #qa.thresholds >= 1,
            "%s: quota_alerts needs a quota limiter (counting requests or response bytes) and a "
            .. "list of thresholds", where)
        for j, t in ipairs(qa.thresholds) do
            check(positive_int(t) and t <= 100, "%s: quota_alerts.thresholds[%d] must be a percent "
                .. "from 1 to 100", where, j)
        end
        qa.owner = qa.owner or "tenant"
        check_scope(where .. ".quota_alerts.owner", { qa.owner })
    end
    local al = r.alerts
    if al then
        refs.compile(al)
        al.from_level = al.from_level or 2
        check(positive_int(al.from_level) and al.from_level <= 3,
            "%s: alerts.from_level must be 1, 2 or 3", where)
        al.level3 = al.level3 or "suspend"
        check_opt(where, "alerts.level3", al.level3, tiers,
            function(v) return v == "suspend" or v == "page" end, "suspend or page")
        if l.box or l.trip then
            -- paging instead of suspending: level 3 must not be a manual box
            -- (a box's third duration, or a distinct rule's level-3 trip)
            for name, data in pairs(next(tiers) and tiers or { ["(none)"] = {} }) do
                local ident = { tier_data = data }
                local box, trip = refs.resolve(l.box, ident), refs.resolve(l.trip, ident)
                local len = box and box[3] or trip.level == 3 and trip.duration or 1
                if refs.resolve(al.level3, ident) == "page" then
                    check(len > 0, "%s: tier %s pages at level 3, so its level-3 box must "
                        .. "last (not 0, a suspension)", where, name)
                end
            end
        end
    end
end

--- Validates and compiles the rule part of `conf` (built by
--- resty.rl.policy.config over its defaults: routes compiled). Raises an error
--- naming the offending field.
function _M.compile(conf)
    check(type(conf.rules) == "table" and #conf.rules >= 1, "rules must be a non-empty list")
    conf.tiers = conf.tiers or {}
    local names = {}
    for i, r in ipairs(conf.rules) do
        validate_rule(i, r, conf)
        check(not names[r.name], "rules[%d]: the name %s is used twice", i, r.name)
        names[r.name] = true
    end
    local id = conf.identity
    id.api_key = id.api_key or { header = id.header, keys = id.keys }
    id.api_key.header = id.api_key.header or "X-Api-Key"
    id.api_key.keys = id.api_key.keys or {}
    for k, e in pairs(id.api_key.keys) do
        check(type(k) == "string" and type(e) == "table" and type(e.key_id) == "string",
            "identity.api_key.keys: each entry needs a key_id")
        check(e.tier == nil or conf.tiers[e.tier], "identity.api_key.keys: unknown tier %s",
            tostring(e.tier))
    end
    id.store = id.store or id.api_key.store or false
    id.cache_ttl = id.cache_ttl or 2
    check(type(id.cache_ttl) == "number" and id.cache_ttl >= 0, "identity.cache_ttl must be >= 0")
    if id.jwt then
        local j = id.jwt
        j.alg = j.alg or "HS256"
        if j.alg == "HS256" then
            check(type(j.secret_env) == "string" or type(j.secret) == "string",
                "identity.jwt: secret_env (or secret) is needed to verify HS256 tokens")
        else
            check(jws.ALGS[j.alg], "identity.jwt.alg must be HS256, RS256 or ES256")
            local pem = j.public_key
            if j.public_key_file then
                local f = io.open(j.public_key_file, "rb")
                check(f, "identity.jwt.public_key_file %s cannot be read", j.public_key_file)
                pem = f:read("*a")
                f:close()
            end
            check(type(pem) == "string", "identity.jwt: public_key_file (or public_key, PEM) "
                .. "is needed to verify %s tokens", j.alg)
            local key, err = jws.load_key(pem)
            check(key, "identity.jwt: the public key: %s", tostring(err))
            j.key = key
        end
        id.jwt.claims = id.jwt.claims or { user = "sub" }
    end
    check(conf.default_tier == nil or conf.tiers[conf.default_tier],
        "default_tier names an unknown tier")
    local body = conf.body or { format = "problem" }
    conf.body = body
    check(body.format == "problem" or (body.format == "json" and type(body.template) == "table"),
        "body.format must be problem, or json with a template table")
    conf.alerts = conf.alerts or {}
    conf.alerts.stream = conf.alerts.stream or (conf.key_prefix .. ":alerts")
    conf.alerts.maxlen = conf.alerts.maxlen or 10000
    conf.quota_alerts = conf.quota_alerts or {}
    -- rlctl watch reads this stream (rlctl/README.md, "Quota events")
    conf.quota_alerts.stream = conf.quota_alerts.stream or "rl:events:quota"
    conf.quota_alerts.maxlen = conf.quota_alerts.maxlen or 100000
    conf.upstream_headers = conf.upstream_headers or {}
    for name, v in pairs(conf.upstream_headers) do
        local ref = refs.as_ref(v)
        check(type(name) == "string" and (ref or type(v) == "string" and v:match("^attr:%w+$")),
            "upstream_headers.%s must be a reference (tier.<field>, ...) or attr:<attribute>",
            tostring(name))
        conf.upstream_headers[name] = ref or v
    end
    if conf.trusted_proxies then
        conf.client_ip_header = conf.client_ip_header or "X-Forwarded-For"
    end
    return conf
end

return _M
