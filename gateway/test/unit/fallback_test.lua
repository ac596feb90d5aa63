-- What the gateway does without Redis, and what it counts: the local
-- per-worker limiter (resty.rl.limit.fallback) on a clock set by the test, and
-- the Prometheus exposition of the counters (resty.rl.observe.metrics).
local T = require "unit"
local fallback = require "resty.rl.limit.fallback"
local metrics = require "resty.rl.observe.metrics"

-- Runs `fn(set)` with the library's clock (ngx.now) at the time `set(t)`
-- last gave, then restores the clock.
local function at_times(fn)
    local clock, now = ngx.now, 0
    ngx.now = function() return now end
    local ok, err = pcall(fn, function(t) now = t end)
    ngx.now = clock
    if not ok then
        error(err, 0)
    end
end

-- The scaled budgets an entry (bucket `p`, tenant bucket `also`) gets on
-- the local limiter.
local function scaled(p, also)
    local e = { key = "k", name = "n", cost = 1, rule = { unit = "points" },
                params = { kind = "bucket", rate = p.rate, burst = p.burst, period = 60,
                           also = also and { { rate = also.rate, burst = also.burst,
                                               period = 60 } } },
                also_keys = { "t" }, also_names = { "m" } }
    fallback.decide_entry({ fallback_ratio = 0.25, fallback_entries = 10 }, e)
    return { rate = e.params.rate, burst = e.params.burst }, e
end

T.test("the local limiter's budget is a fraction of the tier's, at least 1", function()
    T.eq(scaled({ rate = 3000, burst = 100 }), { rate = 750, burst = 25 })
    T.eq(scaled({ rate = 1, burst = 3 }), { rate = 1, burst = 1 })
    local _, e = scaled({ rate = 3000, burst = 100 }, { rate = 6000, burst = 200 })
    T.eq({ e.params.also[1].rate, e.params.also[1].burst }, { 1500, 50 }, "the tenant's too")
    T.eq({ e.name, e.also_names[1] }, { "n-degraded", "m-degraded" })
    T.eq(e.outcome.binding, { name = "n-degraded", limit = 25, remaining = 24, reset_ms = 80,
                              window = 60, unit = "points" })
end)

T.test("the local limiter: a burst, a refill, the binding bucket", function()
    at_times(function(set)
        local conf = { fallback_entries = 100 }
        -- 1 point a second per key (3 at most) and per tenant (5 at most)
        local buckets = { { name = "key:a", rate = 60, burst = 3 },
                          { name = "tenant:t", rate = 60, burst = 5 } }
        set(1000)
        T.eq({ fallback.take(conf, buckets, 60, 1) }, { true, 1, 2, 0 })
        T.eq({ fallback.take(conf, buckets, 60, 2) }, { true, 1, 0, 0 })
        T.eq({ fallback.take(conf, buckets, 60, 1) }, { false, 1, 0, 1000 }, "the key is empty")
        set(1000.5)
        T.eq({ fallback.take(conf, buckets, 60, 1) }, { false, 1, 0, 500 }, "half a point back")
        set(1001)
        T.eq({ fallback.take(conf, buckets, 60, 1) }, { true, 1, 0, 0 }, "a point back")
        -- another key of the tenant: the tenant's bucket binds (2 points left of 5)
        local other = { { name = "key:b", rate = 60, burst = 3 }, buckets[2] }
        T.eq({ fallback.take(conf, other, 60, 3) }, { false, 2, 2, 1000 })
        T.eq({ fallback.take(conf, other, 60, 2) }, { true, 2, 0, 0 })
        T.eq({ fallback.take(conf, { other[1] }, 60, 1) }, { true, 1, 0, 0 },
            "the refusal took nothing from the key's bucket")
        set(1100)
        T.eq({ fallback.take(conf, buckets, 60, 3) }, { true, 1, 0, 0 }, "full again, no more")
    end)
end)

T.test("each configuration has its own local buckets", function()
    at_times(function(set)
        set(5000)
        local b = { { name = "key:a", rate = 1, burst = 1 } }
        T.eq(fallback.take({ fallback_entries = 10 }, b, 60, 1), true)
        T.eq(fallback.take({ fallback_entries = 10 }, b, 60, 1), true, "another configuration")
    end)
end)

T.test("the Prometheus exposition of the counters", function()
    local d = ngx.shared.rl_metrics
    d:flush_all()
    local conf = { metrics_dict = "rl_metrics" }
    metrics.redis_error(conf, "timeout")
    metrics.redis_error(conf, "connect 127.0.0.1:6379: connection refused")
    metrics.redis_error(conf, "closed")
    metrics.redis_error(conf, "ERR unknown command")
    metrics.redirect(conf, "MOVED")
    metrics.redirect(conf, "ASK")
    metrics.redirect(conf, "ASK")
    d:set("req\1throttled\1GET /v1/items/{id}\1growth", 3)
    d:set("req\1allowed\1odd\"route\\\1none", 7)
    d:set("\1pending\1123", 1)
    T.eq(metrics.render("rl_metrics"), table.concat({
        "# HELP rl_gateway_requests_total Rate-limit decisions of the gateway.",
        "# TYPE rl_gateway_requests_total counter",
        'rl_gateway_requests_total{decision="allowed",route="odd\\"route\\\\",tier="none"} 7',
        'rl_gateway_requests_total{decision="throttled",route="GET /v1/items/{id}",tier="growth"} 3',
        "# HELP rl_gateway_redis_errors_total Failed or too slow calls to Redis.",
        "# TYPE rl_gateway_redis_errors_total counter",
        'rl_gateway_redis_errors_total{kind="error"} 1',
        'rl_gateway_redis_errors_total{kind="refused"} 2',
        'rl_gateway_redis_errors_total{kind="timeout"} 1',
        "# HELP rl_gateway_redis_redirects_total Redis Cluster redirections followed.",
        "# TYPE rl_gateway_redis_redirects_total counter",
        'rl_gateway_redis_redirects_total{kind="ask"} 2',
        'rl_gateway_redis_redirects_total{kind="moved"} 1',
    }, "\n") .. "\n")
    d:flush_all()
    local empty = metrics.render("rl_metrics")
    T.ok(empty:find("# TYPE rl_gateway_redis_redirects_total counter", 1, true), "the families")
    for line in empty:gmatch("[^\n]+") do
        T.eq(line:sub(1, 1), "#", "no counters: comments only")
    end
    metrics.redis_error({}, "timeout")
    T.eq(d:get("err\1timeout"), nil, "no metrics_dict: nothing counted")
end)
