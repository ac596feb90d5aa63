-- Rule policies that must not start: each bad option stops the build
-- (resty.rl.policy.config.build, as at nginx's start and reload and in Kong's
-- schema) with an error naming it.
local T = require "unit"
local config = require "resty.rl.policy.config"

-- A valid policy: one tier, one route of cost 5, one rule "alpha" (a
-- bucket with strikes and a box), an API key.
local function good()
    return {
        tiers = { pro = { rate = 10, burst = 20 } },
        routes = { { method = "POST", template = "/v1/pay", cost = 5 } },
        identity = { api_key = { keys = { k = { key_id = "k1", tenant = "t", tier = "pro" } } } },
        rules = { {
            name = "alpha", scope = { "key_id" },
            limiter = { kind = "bucket", rate = 10, burst = 20,
                        strikes = { threshold = 3, window = 60 }, box = { 60, 600, 3600 } },
        } },
    }
end

-- A change to the limiter of good()'s rule: its kind's valid options
-- replaced by `l`.
local function limiter(l)
    return function(p)
        p.rules[1].limiter = l
    end
end

-- A change to good()'s rule: `fields` set on it.
local function rule(fields)
    return function(p)
        for k, v in pairs(fields) do
            p.rules[1][k] = v
        end
    end
end

local R = "rules[1] (alpha)"
local L = R .. ".limiter"

-- A case of the tables below: good() changed by `c.mod` is refused with
-- an error containing `c.err`.
local refused = T.refusing(good, config.build, "rl config: ")

T.test("the base policy builds", function()
    T.eq(config.build(good()).rules[1].name, "alpha")
end)

T.cases("a bad rule is named", {
    { name = "no rules", mod = function(p) p.rules = {} end, err = "rules must be a non-empty list" },
    { name = "a rule that is no table", mod = function(p) p.rules[1] = 5 end,
      err = "rules[1] must be a table" },
    { name = "name", mod = rule({ name = "a b" }),
      err = "rules[1]: name must be letters, digits, - _ . ({tier} is replaced by the tier)" },
    { name = "a name used twice", mod = function(p) p.rules[2] = p.rules[1] end,
      err = "rules[2]: the name alpha is used twice" },
    { name = "match", mod = rule({ match = 5 }), err = R .. ": match must be a table" },
    { name = "match.path", mod = rule({ match = { path = "v1/x" } }),
      err = R .. ": match.path must be a template starting with /" },
    { name = "match.routes", mod = rule({ match = { routes = { "GET /nope" } } }),
      err = R .. ': match.routes names an unknown route "GET /nope"' },
    { name = "scope empty", mod = rule({ scope = {} }), err = R .. ": scope must list attributes" },
    { name = "scope attribute", mod = rule({ scope = { "key_id", "nope" } }),
      err = R .. ': scope[2] "nope" is not an attribute (key_id, tenant, tier, user, brand, ip, '
          .. "subject, route, header:<name>, arg:<name>, claim:<name>)" },
    { name = "tag", mod = rule({ tag = "ip" }),
      err = R .. ": tag ip must be one of the scope's attributes" },
    { name = "limiter.kind", mod = limiter({ kind = "leaky" }),
      err = R .. ": limiter.kind must be bucket, window, quota, lease or distinct" },
    { name = "cost", mod = rule({ cost = -1 }),
      err = R .. ': cost must be an integer >= 0, "route" or {arg = name}' },
    { name = "cost fraction", mod = rule({ cost = 1.5 }),
      err = R .. ': cost must be an integer >= 0, "route" or {arg = name}' },
    { name = "count", mod = rule({ count = "bytes" }),
      err = R .. ": count must be requests, failures or response_bytes" },
    { name = "count response_bytes on a bucket", mod = rule({ count = "response_bytes" }),
      err = R .. ": count response_bytes needs a quota or window limiter without also or strikes" },
    { name = "count failures on a bucket", mod = rule({ count = "failures" }),
      err = R .. ": count failures needs a window or distinct limiter without also" },
    { name = "a cost above the burst", mod = rule({ cost = 30 }),
      err = R .. ": limiter.burst must be at least the cost 30" },
    { name = "a route's cost above the burst",
      mod = function(p)
          p.rules[1].cost = "route"
          p.rules[1].limiter.burst = 2
      end, err = R .. ": limiter.burst must be at least the dearest route's cost 5" },
    { name = "one_in_flight without failures", mod = rule({ one_in_flight = {} }),
      err = R .. ": one_in_flight needs count = failures" },
    { name = "on_refusal.action", mod = rule({ on_refusal = { action = "ban" } }),
      err = R .. ": on_refusal.action must be reject, quota, challenge or soft" },
    { name = "on_refusal.status", mod = rule({ on_refusal = { status = 200 } }),
      err = R .. ": on_refusal.status must be an HTTP error status" },
    { name = "on_refusal.headers", mod = rule({ on_refusal = { headers = "X-A: 1" } }),
      err = R .. ": on_refusal.headers must be a table" },
    { name = "on_redis_failure", mod = rule({ on_redis_failure = "maybe" }),
      err = R .. ": on_redis_failure must be local, open or closed" },
    { name = "on_redis_failure per tier", mod = function(p)
        p.tiers.pro.fail = "later"
        p.rules[1].on_redis_failure = "tier.fail"
    end, err = R .. ": on_redis_failure must be local, open or closed (tier pro)" },
    { name = "quota_alerts on a bucket", mod = rule({ quota_alerts = { thresholds = { 50 } } }),
      err = R .. ": quota_alerts needs a quota limiter (counting requests or response bytes) "
          .. "and a list of thresholds" },
    { name = "alerts.from_level", mod = rule({ alerts = { from_level = 4 } }),
      err = R .. ": alerts.from_level must be 1, 2 or 3" },
    { name = "alerts.level3", mod = rule({ alerts = { level3 = "email" } }),
      err = R .. ": alerts.level3 must be suspend or page" },
    { name = "paging with a manual level-3 box", mod = function(p)
        p.rules[1].limiter.box = { 60, 600, 0 }
        p.rules[1].alerts = { level3 = "page" }
    end, err = R .. ": tier pro pages at level 3, so its level-3 box must last (not 0, a "
        .. "suspension)" },
    { name = "paging with a manual level-3 trip", mod = function(p)
        p.rules[1] = { name = "alpha", scope = { "ip" }, alerts = { level3 = "page" },
                       limiter = { kind = "distinct", member = "subject", limit = 5, window = 60,
                                   trip = { level = 3, duration = 0 } } }
    end, err = R .. ": tier pro pages at level 3" },
}, refused)

T.cases("a bad limiter option is named", {
    { name = "bucket rate", mod = limiter({ kind = "bucket", rate = 0, burst = 20 }),
      err = L .. ": rate must be an integer >= 1" },
    { name = "bucket burst", mod = limiter({ kind = "bucket", rate = 1, burst = "x" }),
      err = L .. ": burst must be an integer >= 1" },
    { name = "bucket period", mod = limiter({ kind = "bucket", rate = 1, burst = 9, period = 0 }),
      err = L .. ": period must be seconds > 0 with at most 3 decimals" },
    { name = "bucket period decimals",
      mod = limiter({ kind = "bucket", rate = 1, burst = 9, period = 0.0001 }),
      err = L .. ": period must be seconds > 0 with at most 3 decimals" },
    { name = "bucket delay", mod = limiter({ kind = "bucket", rate = 1, burst = 9, delay = 0 }),
      err = L .. ": delay must be seconds > 0 (the longest wait)" },
    { name = "bucket reserve",
      mod = limiter({ kind = "bucket", rate = 1, burst = 9, reserve = 101 }),
      err = L .. ": reserve must be an integer percent from 0 to 100" },
    { name = "window limit", mod = limiter({ kind = "window", limit = 0, window = 60 }),
      err = L .. ": limit must be an integer >= 1" },
    { name = "window window", mod = limiter({ kind = "window", limit = 9, window = 1 / 3 }),
      err = L .. ": window must be seconds > 0 with at most 3 decimals" },
    { name = "window mode", mod = limiter({ kind = "window", limit = 9, window = 60,
                                            mode = "rolling" }),
      err = L .. ": mode must be sliding, exact or fixed" },
    { name = "exact window limit",
      mod = limiter({ kind = "window", limit = 10001, window = 60, mode = "exact" }),
      err = L .. ": limit must be at most 10000 with mode exact" },
    { name = "quota limit", mod = limiter({ kind = "quota", limit = 0, period = "DAY" }),
      err = L .. ": limit must be an integer >= 1" },
    { name = "quota period", mod = limiter({ kind = "quota", limit = 9, period = "YEAR" }),
      err = L .. ": period must be DAY, WEEK or MONTH" },
    { name = "quota region",
      mod = limiter({ kind = "quota", limit = 9, period = "MONTH", region = "yes" }),
      err = L .. ": region must be true or false" },
    { name = "quota region on an also key",
      mod = limiter({ kind = "quota", limit = 9, period = "MONTH",
                      also = { { name = "t", scope = { "tenant" }, limit = 90, region = true } } }),
      err = L .. ".also[1]: region is the limiter's option (it covers every also key)" },
    { name = "lease max", mod = limiter({ kind = "lease", max = 0 }),
      err = L .. ": max must be an integer from 1 to 1000" },
    { name = "lease max too large", mod = limiter({ kind = "lease", max = 1001 }),
      err = L .. ": max must be an integer from 1 to 1000" },
    { name = "lease ttl", mod = limiter({ kind = "lease", max = 1, ttl = 0 }),
      err = L .. ": ttl must be seconds > 0" },
    { name = "lease expected", mod = limiter({ kind = "lease", max = 1, expected = -1 }),
      err = L .. ": expected must be seconds > 0" },
    { name = "distinct member", mod = limiter({ kind = "distinct", limit = 5, window = 60 }),
      err = L .. ": member must name the attribute counted (subject, ip, header:<name>, ...)" },
    { name = "distinct member attribute",
      mod = limiter({ kind = "distinct", member = "nope", limit = 5, window = 60 }),
      err = L .. '.member: scope[1] "nope" is not an attribute' },
    { name = "distinct limit",
      mod = limiter({ kind = "distinct", member = "ip", limit = 10001, window = 60 }),
      err = L .. ": limit must be an integer from 1 to 10000" },
    { name = "distinct with strikes",
      mod = limiter({ kind = "distinct", member = "ip", limit = 5, window = 60,
                      strikes = { threshold = 1, window = 60 } }),
      err = L .. ": a distinct limiter boxes with trip = {level, duration}, not strikes/box/jitter" },
    { name = "distinct trip", mod = limiter({ kind = "distinct", member = "ip", limit = 5,
                                              window = 60, trip = { level = 4, duration = 60 } }),
      err = L .. ": trip must be {level = 1 to 3, duration = seconds >= 0 (0 = manual)}" },
    { name = "distinct min_events without trip",
      mod = limiter({ kind = "distinct", member = "ip", limit = 5, window = 60, min_events = 9 }),
      err = L .. ": min_events needs trip" },
    { name = "distinct min_events", mod = limiter({ kind = "distinct", member = "ip", limit = 5,
        window = 60, min_events = 1, trip = { level = 3, duration = 60 } }),
      err = L .. ": min_events must be an integer from 2 to 10001" },
    { name = "strikes", mod = limiter({ kind = "bucket", rate = 1, burst = 9,
                                        strikes = { threshold = 0, window = 60 } }),
      err = L .. ": strikes must be {threshold = integer >= 1, window = seconds > 0, "
          .. "every_refusal = boolean} or none" },
    { name = "strikes every_refusal", mod = limiter({ kind = "bucket", rate = 1, burst = 9,
        strikes = { threshold = 1, window = 60, every_refusal = "yes" } }),
      err = L .. ": strikes must be" },
    { name = "box without strikes",
      mod = limiter({ kind = "bucket", rate = 1, burst = 9, box = { 1, 2, 3 } }),
      err = L .. ": box needs strikes" },
    { name = "box", mod = limiter({ kind = "bucket", rate = 1, burst = 9,
                                    strikes = { threshold = 1, window = 60 }, box = { 1, 2 } }),
      err = L .. ": box must be 3 durations in seconds >= 0 (0 = manual)" },
    { name = "offenses_ttl", mod = limiter({ kind = "bucket", rate = 1, burst = 9,
                                             offenses_ttl = 0 }),
      err = L .. ": offenses_ttl must be seconds > 0" },
    { name = "jitter", mod = limiter({ kind = "bucket", rate = 1, burst = 9, jitter = 101 }),
      err = L .. ": jitter must be an integer percent from 0 to 100" },
    { name = "also on a lease", mod = limiter({ kind = "lease", max = 1,
                                                also = { { name = "t", scope = { "tenant" } } } }),
      err = R .. ": also works with bucket, window and quota only" },
    { name = "also without a name", mod = limiter({ kind = "bucket", rate = 1, burst = 9,
        also = { { scope = { "tenant" }, rate = 1, burst = 9 } } }),
      err = L .. ".also[1]: name missing" },
    { name = "also's scope", mod = limiter({ kind = "bucket", rate = 1, burst = 9,
        also = { { name = "t", rate = 1, burst = 9 } } }),
      err = L .. ".also[1]: scope must list attributes" },
    { name = "also's rate", mod = limiter({ kind = "bucket", rate = 1, burst = 9,
        also = { { name = "t", scope = { "tenant" }, rate = 0, burst = 9 } } }),
      err = L .. ".also[1]: rate must be an integer >= 1" },
    { name = "a tier reference the tier lacks", mod = limiter({ kind = "bucket",
        rate = "tier.nope", burst = 10 }),
      err = L .. ": rate must be an integer >= 1 (tier pro)" },
    { name = "a runtime reference without default",
      mod = limiter({ kind = "window", limit = { ref = "brand.max" }, window = 60 }),
      err = "brand.max needs a default (the identity store may not have it)" },
}, refused)

T.cases("a bad allowance, settlement or quota event option is named", {
    { name = "allowance on a window", mod = function(p)
        p.rules[1].limiter = { kind = "window", limit = 9, window = 60 }
        p.rules[1].allowance = { size = 5 }
    end, err = R .. ": allowance needs a bucket limiter without also, strikes, delay or jitter" },
    { name = "allowance with strikes", mod = rule({ allowance = { size = 5 } }),
      err = R .. ": allowance needs a bucket limiter without also, strikes, delay or jitter" },
    { name = "allowance.size", mod = function(p)
        p.rules[1].limiter = { kind = "bucket", rate = 1, burst = 9 }
        p.rules[1].allowance = { size = 0 }
    end, err = R .. ": allowance.size must be an integer >= 1" },
    { name = "allowance below the cost", mod = function(p)
        p.rules[1].limiter = { kind = "bucket", rate = 1, burst = 9 }
        p.rules[1].cost = 3
        p.rules[1].allowance = { size = 2 }
    end, err = R .. ": allowance.size must be at least the cost 3" },
    { name = "allowance.max_age", mod = function(p)
        p.rules[1].limiter = { kind = "bucket", rate = 1, burst = 9 }
        p.rules[1].allowance = { size = 2, max_age = 3601 }
    end, err = R .. ": allowance.max_age must be seconds > 0 (at most 3600)" },
    { name = "allowance.dict", mod = function(p)
        p.rules[1].limiter = { kind = "bucket", rate = 1, burst = 9 }
        p.rules[1].allowance = { size = 2, dict = "nope" }
    end, err = R .. ": lua_shared_dict nope (the allowances of the node) is not declared" },
    { name = "allowance.refill_below", mod = function(p)
        p.rules[1].limiter = { kind = "bucket", rate = 1, burst = 9 }
        p.rules[1].allowance = { size = 2, refill_below = 2 }
    end, err = R .. ": allowance.refill_below must be an integer >= 0, below size" },
    { name = "settle.from", mod = rule({ settle = { from = "magic" } }),
      err = R .. ": settle.from must be header, usage or bytes" },
    { name = "settle on a lease", mod = function(p)
        p.rules[1].limiter = { kind = "lease", max = 1 }
        p.rules[1].settle = { from = "bytes" }
    end, err = R .. ": settle works with bucket, window and quota limiters" },
    { name = "settle with a delay", mod = function(p)
        p.rules[1].limiter = { kind = "bucket", rate = 1, burst = 9, delay = 1 }
        p.rules[1].settle = { from = "bytes" }
    end, err = R .. ": settle needs count = requests, no delay and no allowance" },
    { name = "settle.header", mod = rule({ settle = { from = "header" } }),
      err = R .. ": settle.header must name the upstream's response header" },
    { name = "settle.scale", mod = rule({ settle = { from = "bytes", scale = 0 } }),
      err = R .. ": settle.scale must be > 0" },
    { name = "quota_alerts.thresholds", mod = function(p)
        p.rules[1].limiter = { kind = "quota", limit = 9, period = "MONTH" }
        p.rules[1].quota_alerts = { thresholds = { 50, 150 } }
    end, err = R .. ": quota_alerts.thresholds[2] must be a percent from 1 to 100" },
    { name = "quota_alerts.owner", mod = function(p)
        p.rules[1].limiter = { kind = "quota", limit = 9, period = "MONTH" }
        p.rules[1].quota_alerts = { thresholds = { 50 }, owner = "nobody" }
    end, err = R .. '.quota_alerts.owner: scope[1] "nobody" is not an attribute' },
    { name = "one_in_flight.ttl", mod = function(p)
        p.rules[1].limiter = { kind = "window", limit = 5, window = 60 }
        p.rules[1].count = "failures"
        p.rules[1].one_in_flight = { ttl = 0 }
    end, err = R .. ": one_in_flight.ttl must be seconds > 0" },
    { name = "one_in_flight.retry_after", mod = function(p)
        p.rules[1].limiter = { kind = "window", limit = 5, window = 60 }
        p.rules[1].count = "failures"
        p.rules[1].one_in_flight = { retry_after = 0.5 }
    end, err = R .. ": one_in_flight.retry_after must be an integer >= 1" },
}, refused)

T.cases("a bad policy-wide option is named", {
    { name = "a tier's name", mod = function(p) p.tiers["a b"] = {} end,
      err = 'tier name "a b": letters, digits, - and _ only' },
    { name = "a tier that is no table", mod = function(p) p.tiers.cheap = 5 end,
      err = "tier cheap must be a table" },
    { name = "a route with leases", mod = function(p) p.routes[1].leases = {} end,
      err = "routes[1]: leases and auth belong to rules in a rule policy" },
    { name = "a route's template", mod = function(p) p.routes[1].template = "pay" end,
      err = "routes[1]: template must start with /" },
    { name = "an API key without key_id",
      mod = function(p) p.identity.api_key.keys.k.key_id = nil end,
      err = "identity.api_key.keys: each entry needs a key_id" },
    { name = "an API key's tier", mod = function(p) p.identity.api_key.keys.k.tier = "gold" end,
      err = "identity.api_key.keys: unknown tier gold" },
    { name = "identity.cache_ttl", mod = function(p) p.identity.cache_ttl = -1 end,
      err = "identity.cache_ttl must be >= 0" },
    { name = "an HS256 JWT without its secret", mod = function(p) p.identity.jwt = {} end,
      err = "identity.jwt: secret_env (or secret) is needed to verify HS256 tokens" },
    { name = "a JWT algorithm", mod = function(p) p.identity.jwt = { alg = "none" } end,
      err = "identity.jwt.alg must be HS256, RS256 or ES256" },
    { name = "an RS256 JWT without its key", mod = function(p)
        p.identity.jwt = { alg = "RS256" }
    end, err = "identity.jwt: public_key_file (or public_key, PEM) is needed to verify RS256 "
        .. "tokens" },
    { name = "a JWT key file that cannot be read", mod = function(p)
        p.identity.jwt = { alg = "ES256", public_key_file = "/nonexistent/key.pem" }
    end, err = "identity.jwt.public_key_file /nonexistent/key.pem cannot be read" },
    { name = "a JWT key that is no public key", mod = function(p)
        p.identity.jwt = { alg = "RS256", public_key = "-----BEGIN NOTHING-----" }
    end, err = "identity.jwt: the public key: " },
    { name = "default_tier", mod = function(p) p.default_tier = "gold" end,
      err = "default_tier names an unknown tier" },
    { name = "body.format", mod = function(p) p.body = { format = "xml" } end,
      err = "body.format must be problem, or json with a template table" },
    { name = "a JSON body without template", mod = function(p) p.body = { format = "json" } end,
      err = "body.format must be problem, or json with a template table" },
    { name = "an upstream header", mod = function(p)
        p.upstream_headers = { ["X-Plan"] = "gold" }
    end, err = "upstream_headers.X-Plan must be a reference (tier.<field>, ...) or "
        .. "attr:<attribute>" },
    { name = "a general option too", mod = function(p) p.redis = { mode = "ring" } end,
      err = "redis.mode must be single, cluster or sentinel" },
}, refused)
