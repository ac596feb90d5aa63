-- resty.rl.format.headers: RateLimit-Policy, RateLimit, the legacy triple,
-- Retry-After and the degraded mark, as the strings clients read.
local T = require "unit"
local headers = require "resty.rl.format.headers"

local PLAIN = { legacy_headers = false }
local LEGACY = { legacy_headers = true }

T.cases("seconds rounds milliseconds up", {
    { name = "none", ms = nil, want = 0 },
    { name = "zero", ms = 0, want = 0 },
    { name = "negative (a manual box)", ms = -1, want = 0 },
    { name = "one millisecond", ms = 1, want = 1 },
    { name = "a whole second", ms = 1000, want = 1 },
    { name = "just past a second", ms = 1001, want = 2 },
    { name = "a day", ms = 86400000, want = 86400 },
}, function(c)
    T.eq(headers.seconds(c.ms), c.want)
end)

T.cases("a policy item", {
    { name = "requests: no qu", p = { name = "free", quota = 100, window = 60 },
      want = '"free";q=100;w=60' },
    { name = "points", p = { name = "growth-key", quota = 3000, window = 60, unit = "points" },
      want = '"growth-key";q=3000;qu="points";w=60' },
    { name = "a unit of requests says nothing",
      p = { name = "a", quota = 5, window = 1, unit = "requests" }, want = '"a";q=5;w=1' },
    { name = "a concurrency limit has no window",
      p = { name = "reconcile", quota = 2, unit = "concurrent-requests" },
      want = '"reconcile";q=2;qu="concurrent-requests"' },
    { name = "a fractional window as it is",
      p = { name = "b", quota = 4, window = 0.5 }, want = '"b";q=4;w=0.5' },
    { name = "quotes and backslashes escaped",
      p = { name = 'say "hi"\\now', quota = 1, window = 60 },
      want = '"say \\"hi\\"\\\\now";q=1;w=60' },
}, function(c)
    T.eq(headers.policy_item(c.p), c.want)
end)

T.test("RateLimit-Policy lists every policy in order", function()
    T.eq(headers.policy({
        { name = "growth-key", quota = 3000, window = 60, unit = "points" },
        { name = "growth-tenant", quota = 6000, window = 60, unit = "points" },
        { name = "reconcile", quota = 2, unit = "concurrent-requests" },
    }), '"growth-key";q=3000;qu="points";w=60, "growth-tenant";q=6000;qu="points";w=60, '
        .. '"reconcile";q=2;qu="concurrent-requests"')
    T.eq(headers.policy({}), "")
end)

local POLICIES = { { name = "free", quota = 10, window = 60 } }

-- The fields the engine sets for binding `b` (a window or quota: `t` at
-- most its window) under policies POLICIES; a reset of -1 as
-- resty.rl.redis.commands.decode gives it (none).
local function fields(conf, b)
    local out = { ["RateLimit-Policy"] = headers.policy(POLICIES) }
    local binding = { clamp = b.window ~= nil }
    for k, v in pairs(b) do
        binding[k] = v
    end
    if binding.reset_ms == -1 then
        binding.reset_ms = nil
    end
    return headers.ratelimit_field(out, conf, binding)
end

T.cases("RateLimit of the binding policy", {
    { name = "remaining and reset",
      b = { name = "free", limit = 10, remaining = 7, reset_ms = 18000 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=7;t=18' } },
    { name = "reset rounded up",
      b = { name = "free", limit = 10, remaining = 7, reset_ms = 17001 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=7;t=18' } },
    { name = "no reset (-1: a manual box): no t",
      b = { name = "free", limit = 10, remaining = 0, reset_ms = -1 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=0' } },
    { name = "no reset given: no t",
      b = { name = "free", limit = 10, remaining = 3 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=3' } },
    { name = "a negative remaining shows 0",
      b = { name = "free", limit = 10, remaining = -4, reset_ms = 1000 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=0;t=1' } },
    { name = "t at most the window",
      b = { name = "free", limit = 10, remaining = 0, reset_ms = 119000, window = 60 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=0;t=60' } },
    { name = "t within the window untouched",
      b = { name = "free", limit = 10, remaining = 0, reset_ms = 5000, window = 60 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=0;t=5' } },
}, function(c)
    T.eq(fields(PLAIN, c.b), c.want)
end)

T.cases("the legacy triple with legacy_headers", {
    { name = "with a reset", b = { name = "free", limit = 10, remaining = 7, reset_ms = 18000 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=7;t=18',
               ["RateLimit-Limit"] = "10", ["RateLimit-Remaining"] = "7",
               ["RateLimit-Reset"] = "18" } },
    { name = "no reset: no RateLimit-Reset",
      b = { name = "free", limit = 10, remaining = 0, reset_ms = -1 },
      want = { ["RateLimit-Policy"] = '"free";q=10;w=60', RateLimit = '"free";r=0',
               ["RateLimit-Limit"] = "10", ["RateLimit-Remaining"] = "0" } },
}, function(c)
    T.eq(fields(LEGACY, c.b), c.want)
end)

T.cases("RateLimit of an outcome's binding (ratelimit_field)", {
    { name = "a bucket's t may exceed its period",
      b = { name = "k", limit = 100, remaining = 0, reset_ms = 150000, window = 60 },
      want = '"k";r=0;t=150' },
    { name = "a window's t is clamped to the window",
      b = { name = "w", limit = 5, remaining = 0, reset_ms = 150000, window = 60, clamp = true },
      want = '"w";r=0;t=60' },
    { name = "a fractional window clamps up to whole seconds",
      b = { name = "w", limit = 5, remaining = 1, reset_ms = 9000, window = 2.5, clamp = true },
      want = '"w";r=1;t=3' },
    { name = "a box has no t", b = { name = "k", limit = 100, remaining = 0, reset_ms = 300000,
                                     window = 60, boxed = true },
      want = '"k";r=0' },
    { name = "no reset: no t", b = { name = "k", limit = 100, remaining = 5 },
      want = '"k";r=5' },
    { name = "remaining missing shows 0", b = { name = "k", limit = 100, reset_ms = 1 },
      want = '"k";r=0;t=1' },
}, function(c)
    T.eq(headers.ratelimit_field({}, PLAIN, c.b), { RateLimit = c.want })
end)

T.test("ratelimit_field writes the legacy triple too", function()
    T.eq(headers.ratelimit_field({}, LEGACY, { name = "k", limit = 9, remaining = 2,
                                               reset_ms = 2500 }),
        { RateLimit = '"k";r=2;t=3', ["RateLimit-Limit"] = "9", ["RateLimit-Remaining"] = "2",
          ["RateLimit-Reset"] = "3" })
end)

T.test("a degraded answer is marked", function()
    T.eq(headers.degraded({ a = "1" }), { a = "1", ["X-RateLimit-Degraded"] = "fallback" })
    T.eq(headers.DEGRADED, "X-RateLimit-Degraded")
    T.eq(headers.DEGRADED_VALUE, "fallback")
end)

T.cases("Retry-After in delta-seconds", {
    { name = "rounded up", ms = 1500, want = { ["Retry-After"] = "2" } },
    { name = "exact", ms = 300000, want = { ["Retry-After"] = "300" } },
    { name = "zero", ms = 0, want = { ["Retry-After"] = "0" } },
    { name = "a manual box (-1): none", ms = -1, want = {} },
    { name = "no wait: none", ms = nil, want = {} },
}, function(c)
    T.eq(headers.retry_after({}, c.ms, false), c.want)
end)

T.test("Retry-After as an HTTP-date is the end of the wait, never early", function()
    local wait_ms = 3600 * 1000 + 250
    ngx.update_time()
    local before = ngx.now()
    local out = headers.retry_after({}, wait_ms, true)
    ngx.update_time()
    local after = ngx.now()
    local v = out["Retry-After"]
    T.ok(type(v) == "string" and v:match("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$"),
        "an IMF-fixdate: " .. tostring(v))
    local at = ngx.parse_http_time(v)
    T.ok(at >= before + wait_ms / 1000, "not before the end: " .. v)
    -- rounded up to the second
    T.ok(at <= after + wait_ms / 1000 + 1, "within a second of the end: " .. v)
    T.eq(headers.retry_after({}, -1, true), {}, "a manual box has none")
end)

T.test("ends_at is a whole second, rounded up", function()
    ngx.update_time()
    local before = ngx.now()
    local t = headers.ends_at(1500)
    ngx.update_time()
    local after = ngx.now()
    T.eq(t % 1, 0)
    T.ok(t >= before + 1.5 and t <= after + 2.5, "1.5 s from now, rounded up: " .. t)
end)
