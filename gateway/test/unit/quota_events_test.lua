-- Quota threshold events (resty.rl.limit.quota_alerts): the thresholds a
-- request's charge crosses, read from the RL.QUOTA reply, the period
-- label on a clock set by the test, and the event's markers and fields.
local T = require "unit"
local quota_alerts = require "resty.rl.limit.quota_alerts"

T.cases("the thresholds a charge crosses", {
    { name = "below every threshold", t = { 50, 100 }, limit = 10, remaining = 6, cost = 1,
      want = {} },
    { name = "exactly onto 50 %", t = { 50, 100 }, limit = 10, remaining = 5, cost = 1,
      want = { 50 } },
    { name = "past 50 % already: nothing new", t = { 50, 100 }, limit = 10, remaining = 4,
      cost = 1, want = {} },
    { name = "two at once", t = { 50, 75, 100 }, limit = 10, remaining = 2, cost = 4,
      want = { 50, 75 } },
    { name = "the last point", t = { 50, 100 }, limit = 10, remaining = 0, cost = 1,
      want = { 100 } },
    { name = "a third of 3 is not 50 %, two thirds are past it", t = { 50 }, limit = 3,
      remaining = 1, cost = 1, want = { 50 } },
    { name = "nothing charged crosses nothing", t = { 50 }, limit = 10, remaining = 5,
      cost = 0, want = {} },
}, function(c)
    T.eq(quota_alerts.crossed(c.t, c.limit, c.remaining, c.cost), c.want)
end)

-- Runs `fn()` with the library's clock (ngx.time) at `t`.
local function at(t, fn)
    local clock = ngx.time
    ngx.time = function() return t end
    local ok, a = pcall(fn)
    ngx.time = clock
    if not ok then
        error(a, 0)
    end
    return a
end

T.cases("period labels (UTC)", {
    { name = "a month", period = "MONTH", now = 1796212800, want = "2026-12" },
    { name = "a day", period = "DAY", now = 1796212800, want = "2026-12-02" },
    { name = "an ISO week", period = "WEEK", now = 1796212800, want = "2026-W49" },
    { name = "the ISO week of New Year's Day 2027", period = "WEEK", now = 1798804800,
      want = "2026-W53" },
    { name = "the last days of 2024 in week 1 of 2025", period = "WEEK", now = 1735560000,
      want = "2025-W01" },
}, function(c)
    T.eq(at(c.now, function() return quota_alerts.period_label(c.period) end), c.want)
end)

-- A quota rule's entry with threshold events (owner: the tenant).
local ENTRY = { key = "u:{tenant:acme}:monthly", rule = { quota_alerts = {
    thresholds = { 50, 100 }, owner = "tenant" } }, params = { kind = "quota", period = "MONTH" },
    also_names = {} }
local STATE = { ident = { attrs = { tenant = "acme" } } }

T.test("the event of a crossing: its markers, their lifetime, the stream's fields", function()
    local ev = at(1796212800, function()
        return quota_alerts.event(STATE, ENTRY, { name = "monthly", limit = 10, remaining = 0,
                                                  reset_ms = 1000 }, 6)
    end)
    T.eq(ev, {
        markers = { "u:{tenant:acme}:monthly:alerted:monthly:2026-12:50",
                    "u:{tenant:acme}:monthly:alerted:monthly:2026-12:100" },
        thresholds = { 50, 100 },
        ttl_ms = 1000 + 86400000,
        fields = { "tenant", "acme", "quota", "monthly", "used", 10, "limit", 10,
                   "period", "2026-12" },
    })
end)

T.cases("no event", {
    { name = "below every threshold", b = { name = "monthly", limit = 10, remaining = 8 },
      cost = 1 },
    { name = "nothing charged", b = { name = "monthly", limit = 10, remaining = 5 }, cost = 0 },
    { name = "no limit", b = { name = "monthly", limit = 0, remaining = 0 }, cost = 1 },
}, function(c)
    T.eq(quota_alerts.event(STATE, ENTRY, c.b, c.cost), nil)
end)
