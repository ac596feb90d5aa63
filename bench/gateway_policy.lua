-- The policy of `make bench-gateway` (bench/gateway.sh): the sample policy
-- (gateway/nginx/policy.lua) as shipped, with every tier's budgets raised
-- so far that a benchmark run never exhausts them: every request takes
-- the allowed path (RL.TAKE with the tenant bucket, strikes and boxes).
local tier_form = require "resty.rl.policy.tier_form"

local policy = dofile(os.getenv("RL_BENCH_GATEWAY_DIR") .. "/nginx/policy.lua")
local BUDGET = 1e9

local tiers = {}
for name, t in pairs(tier_form.SAMPLE.tiers) do
    local copy = {}
    for k, v in pairs(t) do
        copy[k] = v
    end
    copy.key = { rate = BUDGET, burst = BUDGET }
    copy.tenant = { rate = BUDGET, burst = BUDGET }
    tiers[name] = copy
end
policy.tiers = tiers
return policy
