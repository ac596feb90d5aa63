-- The Kong plugin's schema (kong/kong/plugins/rl/schema.lua) under the
-- tests' PDK shim (test/kong_shim.lua): its defaults make the library's
-- sample policy, and its policy field is validated by the library's own
-- validation (the errors name the option).
local T = require "unit"
local cjson = require "cjson.safe"
local config = require "resty.rl.config"
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
