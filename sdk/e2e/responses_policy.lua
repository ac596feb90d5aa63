-- The rule policy of the response-format end-to-end test
-- (sdk/node-server/test/responses-gateway.test.ts, launched with
-- RL_E2E_POLICY pointing here): every case of sdk/responses.json that the
-- gateway can reach (its `gateway` member is not null) gets its rules,
-- scoped by client IP, on the case's own path. Returns a function: redis
-- port -> configuration.
local cjson = require "cjson.safe"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local f = assert(io.open(here .. "../responses.json", "rb"))
local doc = assert(cjson.decode(f:read("*a")))
f:close()

return function(redis_port)
    local rules = {}
    for _, c in ipairs(doc.cases) do
        if c.gateway ~= cjson.null then
            for _, r in ipairs(c.rules) do
                r.scope = { "ip" }
                r.match = { path = c.request.path }
                for _, a in ipairs(r.limiter.also or {}) do
                    a.scope = { "ip" }
                end
                rules[#rules + 1] = r
            end
        end
    end
    return { redis = { port = redis_port, timeout_ms = 1000 }, rules = rules }
end
