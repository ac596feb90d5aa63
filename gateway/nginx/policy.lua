-- The sample policy of gateway/nginx/nginx.conf, in the tier form: every
-- general option not given here takes its default from
-- resty.rl.policy.config, and the sample's tiers (sandbox / growth /
-- enterprise), route costs, reconcile and export leases and failed-login
-- windows come from SAMPLE in resty.rl.policy.tier_form. See
-- gateway/REFERENCE.md for every option.
return {
    -- one server (RL_REDIS_HOST, RL_REDIS_PORT), Sentinel or Cluster as
    -- RL_REDIS_MODE and its companions say (resty.rl.redis.env)
    redis = require("resty.rl.redis.env").redis({ timeout_ms = 20 }),
    -- Who is calling. Production resolves the caller through its own
    -- authentication (a JWT's claims, an introspection cache); the sample
    -- keeps a static table: API key -> tenant, tier and a key id (the id,
    -- never the key, names Redis keys and appears in logs).
    identity = {
        header = "X-Api-Key",
        keys = {
            ["demo-sandbox-key"] = { tenant = "t-100", tier = "sandbox", key_id = "k-1" },
            ["demo-growth-key"] = { tenant = "t-200", tier = "growth", key_id = "k-2" },
            ["demo-enterprise-key"] = { tenant = "t-300", tier = "enterprise", key_id = "k-3" },
        },
    },
    -- Behind a load balancer that sets it (and strips it from clients):
    -- client_ip_header = "X-Real-IP",
    legacy_headers = false,
    shadow = false,
}
