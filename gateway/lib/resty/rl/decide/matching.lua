-- resty.rl.decide.matching: the rules of a rule policy applied to one request
-- (resty.rl.decide.engine, step 2): whether a rule matches the request, and its
-- entry: the rule's limiter for the caller (references resolved), the
-- cost, the names with the caller's tier, and the Redis keys of its scope.

local identity = require "resty.rl.request.identity"
local refs = require "resty.rl.policy.refs"
local limiters = require "resty.rl.limit.limiters"
local request = require "resty.rl.request.fields"
local memo = require "resty.rl.base.memo"
local hotpath = require "resty.rl.base.hotpath"
local tables = require "resty.rl.base.tables"

local _M = {}

-- An empty table, never written (an option not given).
local NONE = {}

-- Today's UTC date, made again when the day changes.
local today, today_until = "", -1
local function today_at(now)
    if now >= today_until then
        today = os.date("!%Y-%m-%d", now)
        today_until = (math.floor(now / 86400) + 1) * 86400
    end
    return today
end

-- Does every name of `want` have its value in the request (`read(req,
-- name)`; true: any value)? False, the error and the name when one
-- cannot be read (an ambiguous argument, a body too large to read).
local function all_present(want, read, req)
    for name, w in pairs(want) do
        local v, err = read(req, name)
        if err then
            return false, err, name
        end
        if w == true and v == nil or w ~= true and v ~= w then
            return false
        end
    end
    return true
end

--- Does `rule` match the request (its routes, method, path, headers and
--- arguments)? False, the error and the argument's name when an argument
--- of its match cannot be read (the rule must not be skipped then).
function _M.matches(rule, route, req)
    local m = rule.match
    if m.route_set and not m.route_set[route.name] then
        return false
    end
    if m.method then
        local method = req.method()
        if method ~= m.method and not (method == "HEAD" and m.method == "GET") then
            return false
        end
    end
    if m.pattern and not req.path():match(m.pattern) then
        return false
    end
    -- (no loop without headers or arguments to match: resty.rl.base.hotpath)
    if m.header and not all_present(m.header, request.header, req) then
        return false
    end
    if m.arg then
        return all_present(m.arg, request.arg, req)
    end
    return true
end

local tier_names = memo.new(10000)
local function with_tier(name, tier)
    return name:find("{tier}", 1, true) and (name:gsub("{tier}", tier)) or name
end

-- A name of the configuration with the caller's tier for `{tier}`
-- (names and tiers come from the configuration: a bounded set).
local function tier_name(name, tier)
    return tier_names:peek(name, tier) or tier_names:get(name, tier, with_tier)
end

-- Rule keys of one-attribute scopes, by rule and value (the hot keys).
local one_attr_keys = memo.new(10000, true)
local function one_attr_key(rule, v, conf, build)
    return build(conf, rule.tag, { [rule.tag] = v }, rule.name, rule.scope)
end

-- The Redis key of `rule` for the scope `values` (nil when the scope is
-- the tag attribute alone) whose tag attribute is `tag_value`, made by
-- `build(conf, tag_attr, values, name, scope)`; kept when the scope is
-- the tag attribute alone (one value names the key).
local function memo_rule_key(conf, rule, tag_value, values, build)
    local scope = rule.scope
    if #scope ~= 1 or scope[1] ~= rule.tag then
        return build(conf, rule.tag, values, rule.name, scope)
    end
    return one_attr_keys:peek(rule, tag_value)
        or one_attr_keys:get(rule, tag_value, one_attr_key, conf, build)
end

-- Resolves every reference inside `v` for the caller.
local function resolve_deep(v, ident)
    if type(v) ~= "table" then
        return v
    end
    if v.path then
        return resolve_deep(refs.resolve(v, ident), ident)
    end
    return tables.mapped(v, resolve_deep, ident)
end

-- The Redis key of `name` for the scope values: one hash tag per value
-- of the rule's tag attribute, so that a rule's ALSO keys share a slot.
local function rule_key(conf, tag_attr, values, name, scope)
    local parts = { conf.key_prefix, ":{", tag_attr, ":", request.key_part(values[tag_attr]),
                    "}:", (name:gsub("[{}]", "")) }
    for _, a in ipairs(scope) do
        if a ~= tag_attr then
            parts[#parts + 1] = ":" .. a .. "=" .. request.key_part(values[a])
        end
    end
    return table.concat(parts)
end

-- The value of attribute `a` of a rule's scope, into `values`; "missing"
-- when the request has none, or its error and `a`.
local function scope_value(a, _, conf, req, ident, state, values)
    local v, err = identity.attr(conf, req, ident, a, state.route)
    if err then
        return err, a
    end
    if v == nil then
        return "missing"
    end
    values[a] = v
end

-- The key of a compiled key template (resty.rl.policy.rules) for a request:
-- the key, or nil when an attribute has no value and no default, or nil,
-- the error and the attribute.
local function template_key(conf, t, req, ident, route)
    local out = { conf.key_prefix, ":" }
    for _, p in ipairs(t.parts) do
        if type(p) == "string" then
            out[#out + 1] = p
        else
            local v, err = identity.attr(conf, req, ident, p.attr, route)
            if err then
                return nil, err, p.attr
            end
            if v == nil then
                if p.default == nil then
                    return nil
                end
                out[#out + 1] = p.default
            else
                out[#out + 1] = request.key_part(v)
            end
        end
    end
    return table.concat(out)
end

-- The keys of a rule whose key is a template: {key, also_keys} (nil
-- when an attribute is missing; nil, error, attribute).
local function template_keys(conf, rule, req, ident, route)
    local key, err, attr = template_key(conf, rule.key_template, req, ident, route)
    if not key then
        return nil, err, attr
    end
    local also = rule.limiter.also
    local also_keys = NONE
    if also then
        also_keys = {}
        for i, a in ipairs(also) do
            local k
            k, err, attr = template_key(conf, a.key_template, req, ident, route)
            if not k then
                return nil, err, attr
            end
            also_keys[i] = k
        end
    end
    return { key, also_keys }
end

-- Template keys made of an API key record's attributes, by rule and record.
local record_keys = memo.new(10000, true)
-- (the record's attributes are the caller's: no request, no route needed)
local function record_template_keys(rule, _record, conf, ident)
    return template_keys(conf, rule, nil, ident, nil)
end

-- The ALSO policy names of a rule for a tier (a list shared by its entries).
local also_names = memo.new(10000, true)
local function names_of_also(rule, tier)
    local out = {}
    for i, a in ipairs(rule.limiter.also) do
        out[i] = tier_name(a.name, tier)
    end
    return out
end

-- The limiters of rules whose references name the caller's tier only,
-- resolved once per rule and tier.
local tier_limiters = memo.new(10000, true)
local function tier_limiter(rule, _tier, ident)
    return resolve_deep(rule.limiter, ident)
end

-- Entries given back after their request (release), reused by the next
-- ones: a table of 14 fields made and swept per request costs more than
-- its fields written again. At most POOL_MAX (the requests in flight).
local POOL_MAX = 64
local take_entry, give_entry = hotpath.pool(POOL_MAX)

-- An entry to fill in: one given back, else a new one with every field
-- of an entry (false until filled in: a field added later costs LuaJIT
-- a resize).
local function new_entry()
    return take_entry()
        or { rule = false, params = false, cost = false, probe = false, name = false,
             also_names = false, also_keys = false, member = false, tier = false,
             static = false, key = false, day_key = false, outcome = false, keys_id = false,
             known_box = false, fetch = false }
end

-- Gives back entry `e` when nothing can hold it after its request: not
-- spent from an allowance (its fetch timer may hold it), and with nothing
-- its request left on it (a cached box, an allowance's fetch, the local
-- fallback's bucket, a settlement's actual cost).
-- True when `e` is kept. Either way it leaves its request's `list` (the
-- list is given back empty, or dropped), in the same walk.
local function give_back(e, i, list)
    list[i] = nil
    if not e.rule.allowance and not e.known_box and not e.degraded_bucket
        and not e.actual and not e.fetch and give_entry(e) then
        limiters.give_back(e.outcome)
        return nil
    end
    return true
end

-- Entry lists given back (emptied), as the entries.
local take_list, give_list = hotpath.pool(POOL_MAX)

--- A request's list of entries, with room for `most` (resty.rl.decide.engine).
function _M.new_list(most)
    return take_list() or hotpath.new_table(most, 0)
end

--- Gives back the entries of a request's `state` once nothing reads them
--- any more (after its log phase, when no timer holds the state), so
--- that the next requests reuse them (resty.rl.decide.engine); its list too
--- (emptied) when every entry was given back.
function _M.release(state)
    local entries = state.entries
    if entries and not state.redis_error and not state.degraded
        and not hotpath.each(entries, give_back, entries) then
        -- (emptied by give_back: a list the full pool does not keep is dropped)
        give_list(entries)
    end
end

-- The cost of `rule`'s entry for the request: a number, or nil when its
-- cost argument is missing (the rule does not apply), or nil, the error
-- and the argument's name.
local function entry_cost(rule, state, req)
    local cost = rule.cost
    if cost == "route" then
        return request.cost(state.route, req)
    elseif type(cost) ~= "table" then
        return cost
    end
    local v, err = request.arg(req, cost.arg)
    if err then
        return nil, err, cost.arg
    end
    if v == nil then
        return nil
    end
    local n = tonumber(v)
    if not n or n < 0 or n ~= n or n == math.huge then
        return nil, "invalid", cost.arg
    end
    -- + 0: a "-0" argument makes -0, which would be sent as "-0"
    return math.ceil(n * (cost.scale or 1)) + 0
end

-- A new entry of `rule` with the cost `cost` (and the day's key of a
-- calendar quota) and the fields that do not depend on the cost: its
-- limiter `params` (`static`: every caller's, or its tier's), names, keys.
local function filled(conf, rule, cost, params, static, name, tier, anames, akeys, member, key,
                      keys_id)
    -- failures and response bytes are probed now, charged after the response;
    -- the outcome is decided later (false until then: a field given here
    -- is not added to the table later, see resty.rl.decide.phases.start)
    local e = new_entry()
    e.rule, e.params, e.cost, e.probe = rule, params, cost, rule.count ~= "requests"
    e.name, e.tier, e.static, e.also_names, e.also_keys = name, tier, static, anames, akeys
    e.member, e.key, e.day_key, e.outcome, e.keys_id = member, key, false, false, keys_id
    -- a calendar quota counts each day's points too, for the usage dashboard
    -- (an ALSO key of the same command: resty.rl.limit.limiters)
    if params.kind == "quota" and params.period ~= "DAY" and conf.usage and not e.probe then
        e.day_key = limiters.day_key(key, today_at(ngx.time()))
    end
    return e
end

-- The limiter parameters of `rule` that are not the caller's own: every
-- caller's (a limiter without reference), or every caller's of its tier
-- (one naming only the tier, without a tenant override from the identity
-- store); nil when they are the caller's (resolved per request).
local function shared_params(rule, ident)
    if rule.static_limiter then
        return rule.limiter
    end
    local tier = ident.attrs.tier
    if rule.tier_limiter and ident.overrides.tenant == nil and tier then
        return tier_limiters:peek(rule, tier) or tier_limiters:get(rule, tier, tier_limiter, ident)
    end
end

-- The keys of `rule` made from the caller's key record (a key template
-- `from_record`): {key, also keys}, or nil when an attribute is missing.
local function keys_of_record(conf, rule, ident)
    return record_keys:peek(rule, ident.record)
        or record_keys:get(rule, ident.record, record_template_keys, conf, ident)
end

-- The fields of `rule`'s entries for a shared caller (a static API key's:
-- its attributes are never written) when none depends on the request
-- (the scope its tag attribute alone, given by the caller; the limiter
-- every caller's, or its tier's; keys of the caller's record), else
-- false: made once per rule and caller (fixed_fields), not per request.
local fixed_fields = memo.new(10000, true)
local function fixed_of(rule, ident, conf)
    local kt, tag_value = rule.key_template, ident.attrs[rule.tag]
    if not rule.tag_only or tag_value == nil or kt and not (kt.from_record and ident.record) then
        return false
    end
    local params = shared_params(rule, ident)
    if not params then
        return false
    end
    local keys = kt and keys_of_record(conf, rule, ident)
    if kt and not keys or params.also and not keys then
        -- a key attribute missing, or ALSO keys of scopes read per request
        return false
    end
    local tier = ident.attrs.tier or "none"
    return { params = params, name = tier_name(rule.name, tier), tier = tier,
             also_names = params.also and (also_names:peek(rule, tier)
                 or also_names:get(rule, tier, names_of_also)) or NONE,
             also_keys = keys and keys[2] or NONE,
             key = keys and keys[1] or memo_rule_key(conf, rule, tag_value, nil, rule_key),
             keys_id = keys or false }
end

--- One entry (a rule applied to this request), nil when the rule does
--- not apply (an attribute of its scope, its distinct member or its cost
--- argument missing), or nil, "ambiguous" (or "invalid", "too_large"),
--- argument name.
function _M.entry(conf, req, state, rule, ident)
    local f = ident.shared and rule.tag_only and fixed_fields:peek(rule, ident)
    if f == nil then
        -- (false, kept too: the rule's entries depend on the request)
        f = fixed_fields:get(rule, ident, fixed_of, conf)
    end
    if f then
        local cost, err, arg = entry_cost(rule, state, req)
        if cost == nil then
            return nil, err, arg
        end
        return filled(conf, rule, cost, f.params, true, f.name, f.tier, f.also_names,
            f.also_keys, false, f.key, f.keys_id)
    end
    local tag_value, values
    if rule.tag_only then
        -- one attribute: its value, without a table of values
        local err
        tag_value, err = identity.attr(conf, req, ident, rule.tag, state.route)
        if err then
            return nil, err, rule.tag
        elseif tag_value == nil then
            return nil
        end
    else
        values = hotpath.new_table(0, #rule.attrs)
        local why, arg = hotpath.first_of(rule.attrs, scope_value, conf, req, ident, state, values)
        if why == "missing" then
            return nil
        elseif why then
            return nil, why, arg
        end
        tag_value = values[rule.tag]
    end
    -- shared parameters are only read by the entries (`static`)
    local params = shared_params(rule, ident)
    local static = params ~= nil
    if not static then
        params = resolve_deep(rule.limiter, ident)
    end
    local cost, cerr, carg = entry_cost(rule, state, req)
    if cost == nil then
        return nil, cerr, carg
    end
    local tier = ident.attrs.tier or "none"
    local keys
    local kt = rule.key_template
    if kt then
        local kerr, karg
        if kt.from_record and ident.record then
            keys = keys_of_record(conf, rule, ident)
        else
            keys, kerr, karg = template_keys(conf, rule, req, ident, state.route)
        end
        if not keys then
            return nil, kerr, karg
        end
    end
    -- (with a key template: the names of the rule and tier, shared, never written)
    local e = filled(conf, rule, cost, params, static, tier_name(rule.name, tier), tier,
        params.also and (keys and (also_names:peek(rule, tier)
            or also_names:get(rule, tier, names_of_also)) or {}) or NONE,
        keys and keys[2] or params.also and {} or NONE,
        values and values[rule.limiter.member] or false,
        keys and keys[1] or memo_rule_key(conf, rule, tag_value, values, rule_key),
        kt and kt.from_record and ident.record and keys or false)
    if params.also and not keys then
        for i, a in ipairs(params.also) do
            local avals = { [rule.tag] = tag_value }
            for _, attr in ipairs(a.scope) do
                local v = identity.attr(conf, req, ident, attr, state.route)
                if v == nil then
                    return nil
                end
                avals[attr] = v
            end
            e.also_names[i] = tier_name(a.name, tier)
            e.also_keys[i] = rule_key(conf, rule.tag, avals, a.name, a.scope)
        end
    end
    return e
end

return _M
