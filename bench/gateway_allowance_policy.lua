-- The allowance policy of `make bench-gateway` (bench/gateway.sh, target
-- `allowance`): a rule policy with one bucket rule per tenant spent from
-- local allowances (gateway/REFERENCE.md, "Local allowances"), the sample's
-- API keys, and a bucket so large that a run never exhausts it: every
-- request is admitted, nearly all from the node's allowance (one
-- `RL.TAKE ... PARTIAL` per `size` requests, fetched ahead in a timer
-- once the node holds fewer than `refill_below` points).
local sample = dofile(os.getenv("RL_BENCH_GATEWAY_DIR") .. "/nginx/policy.lua")

local keys = {}
for key, who in pairs(sample.identity.keys) do
    keys[key] = { tenant = who.tenant, tier = who.tier, key_id = who.key_id }
end

return {
    redis = sample.redis,
    key_prefix = "bench-al",
    identity = { api_key = { header = sample.identity.header, keys = keys } },
    tiers = { sandbox = {}, growth = {}, enterprise = {} },
    rules = {
        { name = "tenant", scope = { "tenant" },
          limiter = { kind = "bucket", burst = 1e9, rate = 1e9, period = 60 },
          allowance = { size = 200, max_age = 1, refill_below = 50 } },
    },
}
