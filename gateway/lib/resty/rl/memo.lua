-- resty.rl.memo: per-worker memos of values made from two keys (a name
-- and a tier, a rule and a scope value, ...), so that the hot path of a
-- rule policy (resty.rl.engine) makes each once: names with their tier,
-- rule keys, RateLimit-Policy values. Bounded: past `max` values a memo
-- starts over.

local _M = {}

local Memo = {}
Memo.__index = Memo

local WEAK_KEYS = { __mode = "k" }

--- A memo of at most `max` values; with `weak`, its first keys are weak
--- (tables such as rules: a configuration dropped takes its values along).
function _M.new(max, weak)
    local m = setmetatable({ max = max, n = 0, weak = weak }, Memo)
    m.t = weak and setmetatable({}, WEAK_KEYS) or {}
    return m
end

--- The value of (`a`, `b`): `make(a, b, x, y)` the first time.
function Memo:get(a, b, make, x, y)
    local inner = self.t[a]
    if not inner then
        inner = {}
        self.t[a] = inner
    end
    local v = inner[b]
    if v == nil then
        v = make(a, b, x, y)
        if self.n >= self.max then
            self.t, self.n = self.weak and setmetatable({}, WEAK_KEYS) or {}, 0
            inner = {}
            self.t[a] = inner
        end
        inner[b], self.n = v, self.n + 1
    end
    return v
end

local tier_names = _M.new(10000)
local function with_tier(name, tier)
    return name:find("{tier}", 1, true) and (name:gsub("{tier}", tier)) or name
end

--- A name of the configuration with the caller's tier for `{tier}`
--- (names and tiers come from the configuration: a bounded set).
function _M.tier_name(name, tier)
    return tier_names:get(name, tier, with_tier)
end

-- Rule keys of one-attribute scopes, by rule and value (the hot keys).
local one_attr_keys = _M.new(10000, true)
local function one_attr_key(rule, v, conf, build)
    return build(conf, rule.tag, { [rule.tag] = v }, rule.name, rule.scope)
end

--- The Redis key of `rule` for the scope `values` (nil when the scope is
--- the tag attribute alone) whose tag attribute is `tag_value`, made by
--- `build(conf, tag_attr, values, name, scope)`; kept when the scope is
--- the tag attribute alone (one value names the key).
function _M.rule_key(conf, rule, tag_value, values, build)
    local scope = rule.scope
    if #scope ~= 1 or scope[1] ~= rule.tag then
        return build(conf, rule.tag, values, rule.name, scope)
    end
    return one_attr_keys:get(rule, tag_value, one_attr_key, conf, build)
end

-- RateLimit-Policy values of entries with a static limiter, by rule and tier.
local policies = _M.new(10000, true)
local function policy_of(_rule, _tier, make, e)
    return make(e)
end

--- The RateLimit-Policy value of entry `e`, made by `make(e)`; kept per
--- rule and tier when its limiter is static (`e.static`: the value then
--- depends on nothing else). A quota's is made each time: its window,
--- the calendar month's length, changes with the date.
function _M.policy_field(e, make)
    if not e.static or e.params.kind == "quota" then
        return make(e)
    end
    return policies:get(e.rule, e.tier, policy_of, make, e)
end

return _M
