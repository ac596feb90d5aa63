-- resty.rl.policy.refs: references in a rule policy, values that depend on the
-- caller, resolved per request: "tier.<field>" (the caller's tier,
-- overridden per tenant by the identity store), "tenant.<field>",
-- "brand.<field>" (identity store overrides), or { ref = "...", default = v }.

local _M = {}

local REF_ROOTS = { tier = true, tenant = true, brand = true }

--- A reference {path = {"tier", "monthly"}, default = v} when `v` is one
--- ("tier.monthly", or {ref = "...", default = ...}), else nil.
function _M.as_ref(v)
    local s, default = v, nil
    if type(v) == "table" and type(v.ref) == "string" then
        s, default = v.ref, v.default
    end
    if type(s) ~= "string" then
        return nil
    end
    local root = s:match("^(%a+)%.")
    if not root or not REF_ROOTS[root] then
        return nil
    end
    local path = {}
    for p in s:gmatch("[^%.]+") do
        path[#path + 1] = p
    end
    return { path = path, default = default, text = s }
end

-- The value at `path` (from its 2nd element) in table `t`, or nil.
local function dig(t, path)
    for i = 2, #path do
        if type(t) ~= "table" then
            return nil
        end
        t = t[path[i]]
    end
    return t
end

-- Does `v` hold a reference for which `pred(ref)` is true?
local function any_ref(v, pred)
    if type(v) ~= "table" then
        return false
    end
    if v.path then
        return pred(v)
    end
    for _, x in pairs(v) do
        if any_ref(x, pred) then
            return true
        end
    end
    return false
end

local function always()
    return true
end

local function beyond_tier(ref)
    return ref.path[1] ~= "tier"
end

--- Does `v` hold a reference (a value resolved per caller)?
function _M.has_ref(v)
    return any_ref(v, always)
end

--- Does `v` hold references to the caller's tier only (values the same
--- for every caller of a tier without a tenant override)?
function _M.tier_only(v)
    return not any_ref(v, beyond_tier)
end

--- Resolves `v` for a caller: a reference is looked up in the caller's
--- tier (a per-tenant override first), tenant or brand overrides, falling
--- back to its default; anything else is itself. Override values come
--- from Redis as strings: numbers are converted.
function _M.resolve(v, ident)
    local ref = type(v) == "table" and v.path and v or nil
    if not ref then
        return v
    end
    local root, field = ref.path[1], ref.path[2]
    local out
    if root == "tier" then
        local own = dig(ident and ident.tier_data, ref.path)
        local over = ident and ident.overrides and ident.overrides.tenant
        -- nil (never false) when there is none: the test below compares it
        out = over and #ref.path == 2 and tonumber(over[field]) or nil
        -- an override must be as usable as what it replaces: a number, and
        -- at least 1 where the tier's own value is (a limit, a rate)
        if out == nil or type(own) ~= "number" or own >= 1 and out < 1 then
            out = own
        end
    else
        local over = ident and ident.overrides and ident.overrides[root]
        out = over and over[field]
        local d = ref.default
        if type(d) == "number" then
            out = tonumber(out)
            if out and d >= 1 and out < 1 then
                out = nil
            end
        end
    end
    if out == nil then
        return ref.default
    end
    return out
end

--- Replaces every reference string inside `t` (recursively) by its
--- compiled form, so that a request resolves it without parsing.
function _M.compile(t)
    for k, v in pairs(t) do
        local ref = _M.as_ref(v)
        if ref then
            t[k] = ref
        elseif type(v) == "table" then
            _M.compile(v)
        end
    end
end

--- Every value a rule option takes across the tiers (one per tier for a
--- tier reference; the default for a runtime override), for validation;
--- nil and an error for a runtime override without a default.
function _M.each_value(v, tiers)
    if type(v) ~= "table" or not v.path then
        return { { v, "" } }
    end
    local out = {}
    if v.path[1] == "tier" then
        for name, data in pairs(tiers) do
            local x = dig(data, v.path)
            if x == nil then
                x = v.default
            end
            out[#out + 1] = { x, " (tier " .. name .. ")" }
        end
    else
        if v.default == nil then
            return nil, v.text .. " needs a default (the identity store may not have it)"
        end
        out[1] = { v.default, " (default)" }
    end
    return out
end

return _M
