-- The deposit velocity design: a rule policy.
-- The caller comes from a JWT (HS256, secret in RL_JWT_SECRET) with the
-- user in `sub` and the brand in `brand_id`; RL_REDIS_HOST / RL_REDIS_PORT
-- name Redis. Checks in the design's order, one round trip:
--   requests per IP      60 / min                        429, block_type ip
--   deposit attempts     5 / min per user   -> blocked 5 min  (velocity)
--   deposit attempts     20 / hour per user -> blocked 1 hour (velocity)
--   withdrawal attempts  3 / hour per user  -> blocked 2 hours (velocity)
--   failed payments      3 / 15 min per user (upstream 402) -> re-auth / captcha
--   deposit amount       24 h total per user and brand, per brand
--                        (brand.deposit_total_24h in the identity store,
--                        default 1,000,000 cents) -> soft block: the deposit
--                        goes upstream marked X-KYC-Required (the KYC gate)
-- Every refusal answers the design's body {error, message, retry_after,
-- block_type} with Retry-After; `error` is RATE_LIMIT_EXCEEDED, or
-- REAUTH_REQUIRED for the challenge (UNAUTHENTICATED, INVALID_ARGUMENT,
-- RATE_LIMITER_UNAVAILABLE for the gateway's own answers).
local function velocity(name, route, limit, window, block)
    return {
        name = name, match = { routes = { route } }, scope = { "user" },
        limiter = { kind = "window", mode = "exact", limit = limit, window = window,
                    -- exceeding is the offence: the first refusal blocks
                    strikes = { threshold = 1, window = window, every_refusal = true },
                    box = { block, block, block } },
        on_refusal = { block_type = "velocity", message = name:find("deposit", 1, true)
            and "Too many deposit attempts. Please wait before retrying."
            or "Too many withdrawal attempts. Please wait before retrying." },
    }
end
local DEPOSIT, WITHDRAWAL = "POST /v1/deposits", "POST /v1/withdrawals"

return {
    -- one server, Sentinel or Cluster as RL_REDIS_MODE and its companions
    -- say (resty.rl.redis.env); the design's 20 ms budget unless
    -- RL_REDIS_TIMEOUT_MS gives another
    redis = require("resty.rl.redis.env").redis({ timeout_ms = 20 }),
    key_prefix = "vel",
    -- Retry-After in seconds always (the frontend shows a countdown)
    http_date_after = 315360000,
    trusted_proxies = { "127.0.0.1" },
    identity = {
        required = true,
        jwt = { secret_env = "RL_JWT_SECRET", claims = { user = "sub", brand = "brand_id" } },
        -- brand overrides (deposit_total_24h) from the identity store
        store = true,
        cache_ttl = 2,
    },
    routes = {
        { method = "POST", template = "/v1/deposits", critical = true },
        { method = "POST", template = "/v1/withdrawals", critical = true },
    },
    body = {
        format = "json",
        template = { error = "$error", message = "$message",
                     retry_after = "$retry_after", block_type = "$block_type" },
    },
    rules = {
        {
            name = "ip", scope = { "ip" },
            limiter = { kind = "window", limit = 60, window = 60 },
            on_refusal = { block_type = "ip",
                message = "Too many requests from this address. Back off exponentially." },
        },
        velocity("deposit-1m", DEPOSIT, 5, 60, 300),
        velocity("deposit-1h", DEPOSIT, 20, 3600, 3600),
        velocity("withdrawal-1h", WITHDRAWAL, 3, 3600, 7200),
        {
            name = "failed-payments", match = { routes = { DEPOSIT, WITHDRAWAL } },
            scope = { "user" }, count = "failures", fail_statuses = { 402 },
            limiter = { kind = "window", mode = "exact", limit = 3, window = 900 },
            on_refusal = {
                action = "challenge", status = 401, challenge = "captcha",
                headers = { ["WWW-Authenticate"] = 'Bearer error="reauth_required"',
                            ["X-Challenge"] = "captcha" },
                block_type = "velocity",
                message = "Too many failed payments. Re-authenticate or solve the captcha.",
            },
        },
        {
            name = "deposit-amount-24h", match = { routes = { DEPOSIT } },
            scope = { "user", "brand" }, cost = { arg = "amount" }, unit = "cents",
            limiter = { kind = "window", window = 86400,
                        limit = { ref = "brand.deposit_total_24h", default = 1000000 } },
            on_refusal = { action = "soft", mark_header = "X-KYC-Required",
                           mark_value = "deposit_total_24h", block_type = "amount" },
        },
    },
}
