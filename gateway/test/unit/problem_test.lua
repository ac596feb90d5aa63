-- resty.rl.format.problem: the bodies of refusals (application/problem+json, or a
-- policy's own JSON template), decoded and compared member by member.
local T = require "unit"
local cjson = require "cjson.safe"
local problem = require "resty.rl.format.problem"

local BASE = "https://api.example.com/problems"
local PROBLEM = { body = { format = "problem" }, problem_base = BASE }
local null = ngx.null

-- render's answer: its content type and its body decoded; no "\/" in it
local function render(conf, vars, boxed, fields)
    local ctype, body = problem.render(conf, vars, boxed, fields)
    T.ok(not body:find("\\/", 1, true), "no escaped slash in " .. body)
    local doc = cjson.decode(body)
    T.ok(type(doc) == "table", "a JSON object: " .. body)
    return ctype, doc
end

T.cases("problem bodies", {
    { name = "a throttle (429) with strikes left",
      vars = { status = 429, type = "rate-limit-exceeded", message = "free: 10 per 60 s",
               retry_after = 30, policy = "free", tier = "free", strikes = 3,
               instance = "/v1/items", request_id = "r-1" },
      want = { type = BASE .. "/rate-limit-exceeded", title = "Rate limit exceeded", status = 429,
               detail = "free: 10 per 60 s", instance = "/v1/items", request_id = "r-1",
               retry_after_seconds = 30, recommended_backoff = "exponential_with_full_jitter",
               quota_tier = "free", policy = "free", penalty_strikes_remaining = 3 } },
    { name = "a box (boxed): its level and end",
      boxed = true,
      vars = { status = 429, type = "penalty-box-active", message = "boxed", retry_after = 300,
               policy = "key", tier = "growth", strikes = 0, level = 1, ends_at = 1700000300 },
      want = { type = BASE .. "/penalty-box-active", title = "Penalty box active", status = 429,
               detail = "boxed", retry_after_seconds = 300,
               recommended_backoff = "exponential_with_full_jitter", quota_tier = "growth",
               policy = "key", penalty_strikes_remaining = 0, penalty_level = 1,
               lockout_ends_at = 1700000300 } },
    { name = "a manual box (403): no time to come back, backoff none",
      boxed = true,
      vars = { status = 403, type = "penalty-box-active", message = "review", retry_after = null,
               policy = "key", tier = "enterprise", level = 3, ends_at = null },
      want = { type = BASE .. "/penalty-box-active", title = "Penalty box active", status = 403,
               detail = "review", retry_after_seconds = null, recommended_backoff = "none",
               quota_tier = "enterprise", policy = "key", penalty_level = 3,
               lockout_ends_at = null } },
    { name = "a quota (403) with the upgrade link",
      vars = { status = 403, type = "quota-exceeded", message = "monthly", retry_after = 86400,
               policy = "monthly", tier = "free", upgrade_url = "https://example.com/upgrade" },
      want = { type = BASE .. "/quota-exceeded", title = "Quota exceeded", status = 403,
               detail = "monthly", retry_after_seconds = 86400,
               recommended_backoff = "exponential_with_full_jitter", quota_tier = "free",
               policy = "monthly", upgrade_url = "https://example.com/upgrade" } },
    { name = "a lease conflict (409) with the concurrency limit",
      vars = { status = 409, type = "concurrency-limit-exceeded", message = "busy",
               retry_after = 5, policy = "ledger", concurrency_limit = 1 },
      want = { type = BASE .. "/concurrency-limit-exceeded", title = "Concurrency limit exceeded",
               status = 409, detail = "busy", retry_after_seconds = 5,
               recommended_backoff = "exponential_with_full_jitter", policy = "ledger",
               concurrency_limit = 1 } },
    { name = "a challenge (401) carries the wait and the challenge",
      vars = { status = 401, type = "challenge-required", message = "again", retry_after = 60,
               policy = "payments", challenge = "captcha", block_type = "challenge" },
      want = { type = BASE .. "/challenge-required", title = "Re-authentication required",
               status = 401, detail = "again", retry_after_seconds = 60,
               recommended_backoff = "exponential_with_full_jitter", policy = "payments",
               challenge = "captcha", block_type = "challenge" } },
    { name = "an unknown key (401): no wait, no policy",
      vars = { status = 401, type = "unauthenticated", message = "who?", policy = "free",
               retry_after = 1 },
      want = { type = BASE .. "/unauthenticated", title = "Unknown or missing API key",
               status = 401, detail = "who?" } },
    { name = "fail closed (503)",
      vars = { status = 503, type = "rate-limiter-unavailable", message = "down",
               retry_after = 15 },
      want = { type = BASE .. "/rate-limiter-unavailable", title = "Rate limiter unavailable",
               status = 503, detail = "down", retry_after_seconds = 15,
               recommended_backoff = "exponential_with_full_jitter" } },
    { name = "decided without Redis: degraded",
      vars = { status = 429, type = "rate-limit-exceeded", message = "local", retry_after = 1,
               degraded = "fallback" },
      want = { type = BASE .. "/rate-limit-exceeded", title = "Rate limit exceeded", status = 429,
               detail = "local", retry_after_seconds = 1,
               recommended_backoff = "exponential_with_full_jitter", degraded = "fallback" } },
    { name = "an unknown type is its own title",
      vars = { status = 400, type = "odd-thing", message = "m" },
      want = { type = BASE .. "/odd-thing", title = "odd-thing", status = 400, detail = "m" } },
    { name = "a rule's own members, filled",
      vars = { status = 429, type = "rate-limit-exceeded", message = "m", retry_after = 7,
               policy = "p", tier = "t" },
      fields = { reason = "$policy", note = "tier $tier, $missing wait $retry_after s",
                 wait = "$retry_after", gone = "$missing", fixed = 5 },
      want = { type = BASE .. "/rate-limit-exceeded", title = "Rate limit exceeded", status = 429,
               detail = "m", retry_after_seconds = 7,
               recommended_backoff = "exponential_with_full_jitter", quota_tier = "t",
               policy = "p", reason = "p", note = "tier t,  wait 7 s", wait = 7, gone = null,
               fixed = 5 } },
}, function(c)
    local ctype, doc = render(PROBLEM, c.vars, c.boxed, c.fields)
    T.eq(ctype, "application/problem+json")
    T.eq(doc, c.want)
end)

-- the velocity design's body (gateway/examples/velocity.lua)
local VELOCITY = { body = { format = "json", template = {
    error = "$error", message = "$message", retry_after = "$retry_after",
    block_type = "$block_type" } } }

T.cases("JSON template bodies", {
    { name = "a throttle: the error from the type, numbers stay numbers",
      vars = { status = 429, type = "rate-limit-exceeded", message = "5 a minute",
               retry_after = 300, block_type = "temporary" },
      want = { error = "RATE_LIMIT_EXCEEDED", message = "5 a minute", retry_after = 300,
               block_type = "temporary" } },
    { name = "a challenge", vars = { status = 401, type = "challenge-required", message = "m",
                                     retry_after = 60, block_type = "challenge" },
      want = { error = "REAUTH_REQUIRED", message = "m", retry_after = 60,
               block_type = "challenge" } },
    { name = "an error given wins over the type's",
      vars = { status = 400, type = "ambiguous-argument", message = "m", error = "MINE" },
      want = { error = "MINE", message = "m", retry_after = null, block_type = null } },
    { name = "the gateway's own answers", vars = { status = 503,
        type = "rate-limiter-unavailable", message = "m", retry_after = 15 },
      want = { error = "RATE_LIMITER_UNAVAILABLE", message = "m", retry_after = 15,
               block_type = null } },
    { name = "an unknown type: RATE_LIMIT_EXCEEDED",
      vars = { status = 429, type = "odd", message = "m" },
      want = { error = "RATE_LIMIT_EXCEEDED", message = "m", retry_after = null,
               block_type = null } },
    { name = "a rule's own members",
      vars = { status = 429, type = "quota-exceeded", message = "m", retry_after = 2 },
      fields = { kyc = "needed after $retry_after s", url = "https://x.example/a/b" },
      want = { error = "QUOTA_EXCEEDED", message = "m", retry_after = 2, block_type = null,
               kyc = "needed after 2 s", url = "https://x.example/a/b" } },
}, function(c)
    local ctype, doc = render(VELOCITY, c.vars, false, c.fields)
    T.eq(ctype, "application/json")
    T.eq(doc, c.want)
end)

T.test("encode: a problem of a kind with extension members", function()
    local s = problem.encode(PROBLEM, "rate-limit-exceeded", 429,
        { detail = "d", retry_after_seconds = 3, url = "https://a.example/b" })
    T.ok(not s:find("\\/", 1, true), "no escaped slash in " .. s)
    T.eq(cjson.decode(s), { type = BASE .. "/rate-limit-exceeded", title = "Rate limit exceeded",
                            status = 429, detail = "d", retry_after_seconds = 3,
                            url = "https://a.example/b" })
    T.eq(cjson.decode(problem.encode(PROBLEM, "new-kind", 418, {})),
        { type = BASE .. "/new-kind", title = "new-kind", status = 418 })
end)

T.cases("timestamps are RFC 3339 UTC", {
    { name = "the epoch", t = 0, want = "1970-01-01T00:00:00Z" },
    { name = "a fraction is cut", t = 1700000000.9, want = "2023-11-14T22:13:20Z" },
    { name = "a leap day", t = 1709164800, want = "2024-02-29T00:00:00Z" },
}, function(c)
    T.eq(problem.timestamp(c.t), c.want)
end)

T.test("backoff: none without a wait", function()
    T.eq(problem.backoff(nil), "none")
    T.eq(problem.backoff(0), "exponential_with_full_jitter")
    T.eq(problem.backoff(30), "exponential_with_full_jitter")
end)

T.cases("the detail sentence of a tier-form throttle", {
    { name = "points",
      args = { "growth", { scope = "key", rate = 3000, period = 60, burst = 3000 }, 10, 5 },
      want = "Tier growth: key budget of 3000 points per 60 s (burst 3000); this request costs "
          .. "10 points; the budget refills at 50 points per second; retry in 5 s." },
    { name = "one point, a slow refill",
      args = { "sandbox", { scope = "tenant", rate = 1, period = 60, burst = 50 }, 1, 60 },
      want = "Tier sandbox: tenant budget of 1 points per 60 s (burst 50); this request costs "
          .. "1 point; the budget refills at 0.0167 points per second; retry in 60 s." },
}, function(c)
    T.eq(problem.rate_detail(unpack(c.args)), c.want)
end)
