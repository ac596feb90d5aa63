-- The Kong plugin's schema (kong/kong/plugins/rl/schema.lua) under the
-- tests' PDK shim (test/kong_shim.lua): its defaults make the library's
-- sample policy, and its policy field is validated by the library's own
-- validation (the errors name the option).
local T = require "unit"
local cjson = require "cjson.safe"
local config = require "resty.rl.policy.config"
local shim = require "kong_shim"

shim.install()
local schema = require "kong.plugins.rl.schema"

-- The definition of the plugin configuration's field `name`.
local function config_field(name)
    for _, f in ipairs(schema.fields) do
        local fname, def = next(f)
        if fname == "config" then
            for _, g in ipairs(def.fields) do
                local gname, gdef = next(g)
                if gname == name then
                    return gdef
                end
            end
        end
    end
end

T.test("the schema's defaults build the sample policy", function()
    local conf = config.build(shim.plugin_conf({}))
    T.eq(conf.redis.port, 6379)
    T.ok(conf.tiers.growth and conf.tiers.enterprise, "the sample tiers")
    T.eq(conf.routes[1].name, "POST /v1/ledgers/reconcile")
    T.eq(conf.rules[1].name, "{tier}-key", "translated into a rule policy")
end)

local RULES = { rules = { { name = "a", limiter = { kind = "window", limit = 5, window = 60 } } } }

T.cases("the policy field's validator", {
    { name = "a good rule policy", policy = cjson.encode(RULES), ok = true },
    { name = "not JSON", policy = "{rules:", err = "policy is not a JSON object" },
    { name = "a JSON string", policy = '"rules"', err = "policy is not a JSON object" },
    { name = "no rules", policy = '{"rules": []}', err = "rl config: rules must be a non-empty list" },
    { name = "a bad limiter", policy = cjson.encode({ rules = { { name = "a",
        limiter = { kind = "window", limit = 0, window = 60 } } } }),
      err = "rl config: rules[1] (a).limiter: limit must be an integer >= 1" },
    { name = "a bad general option", policy = cjson.encode({ redis = { mode = "ring" },
        rules = RULES.rules }), err = "rl config: redis.mode must be single, cluster or sentinel" },
}, function(c)
    local ok, err = config_field("policy").custom_validator(c.policy)
    if c.ok then
        T.eq({ ok, err }, { true })
    else
        T.eq(ok, nil)
        T.ok(type(err) == "string" and err:find(c.err, 1, true), tostring(err))
    end
end)

T.test("a plugin configuration with a bad policy is refused", function()
    T.raises(function() shim.plugin_conf({ policy = '{"rules": []}' }) end,
        "schema violation: rl config: rules must be a non-empty list")
end)

-- The tier form's allowance rule (the tenant's bucket) of a plugin
-- configuration built from `user`.
local function allowance_of(user)
    for _, r in ipairs(config.build(shim.plugin_conf(user)).rules) do
        if r.allowance then
            return r.allowance
        end
    end
end

T.test("an allowance's unset options take the library's defaults", function()
    local a = allowance_of({ allowance = { size = 50 } })
    T.eq({ a.max_age, a.refill_below, a.dict, a.borrow, a.home_conf },
        { 1, 0, "rl_allowance", 0, nil })
end)

T.test("a region's allowance: home and borrow reach the rule", function()
    local a = allowance_of({ allowance = { size = 50, borrow = 20,
        home = { host = "10.0.0.9", port = 7000, timeout_ms = 200 } } })
    local h = a.home_conf.redis
    T.eq({ a.home_id, h.mode, h.timeout_ms, a.borrow, a.refill_below },
        { "single/10.0.0.9:7000", "single", 200, 20, 25 })
    -- the home's unset fields are the plugin's redis
    T.eq({ h.pool_size, h.keepalive_ms }, { 64, 60000 })
end)

T.cases("a bad home or borrow is refused naming the option", {
    { name = "borrow without home", allowance = { size = 50, borrow = 20 },
      err = "allowance.borrow needs allowance.home" },
    { name = "home and borrow without size", allowance = { borrow = 20, home = { host = "h" } },
      err = "allowance.size is needed with the other allowance options" },
    { name = "borrow negative", allowance = { size = 50, borrow = -1, home = { host = "h" } },
      err = "allowance.borrow must be an integer >= 0 (points)" },
    { name = "home port", allowance = { size = 50, home = { host = "h", port = 70000 } },
      err = "allowance.home.host must be a string and allowance.home.port a port" },
    { name = "home mode", allowance = { size = 50, home = { host = "h", mode = "ring" } },
      err = "allowance.home.mode must be single, cluster or sentinel" },
    { name = "home sentinel without sentinels", allowance = { size = 50,
        home = { mode = "sentinel" } },
      err = "allowance.home in sentinel mode needs sentinels and master_name" },
}, function(c)
    T.raises(function() shim.plugin_conf({ allowance = c.allowance }) end,
        "schema violation: " .. c.err)
end)
