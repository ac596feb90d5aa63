-- resty.rl.observe.usage_counts: this nginx node's per-key request counters, the
-- usage dashboard's live part (resty.rl.report.usage reads them). The log phase
-- of an ordinary request counts it with count(): one per admitted request
-- (per key and second, kept 61 s), two per refused one (the second per
-- key, reason and minute, kept 11 minutes), in the shared dict
-- `usage.dict`, added per worker at most 50 ms later (resty.rl.observe.metrics.add).
-- No Redis.

local metrics = require "resty.rl.observe.metrics"
local memo = require "resty.rl.base.memo"

local _M = {}

--- The separator of the parts of a counter's name.
_M.SEP = "\1"
local SEP = _M.SEP
--- Seconds of per-second counts kept (the chart's span, the prediction's rate).
_M.SERIES = 60
--- Minutes of refusals kept by reason, this one included.
_M.REFUSAL_MINUTES = 10
local SERIES, REFUSAL_MINUTES = _M.SERIES, _M.REFUSAL_MINUTES

--- The refusal reasons counted (the decisions of resty.rl.observe.metrics that
--- refuse a request).
_M.REASONS = { "throttled", "boxed", "quota_exceeded", "challenged", "conflict", "locked_out",
               "invalid", "degraded_throttled", "failed_closed" }

-- Decisions that let the request through (counted as admitted).
local ADMITTED = { allowed = true, degraded_allowed = true, soft_blocked = true,
                   shadow_allowed = true }

--- The shared dict of the counters (`usage.dict`), or nil when the
--- dashboard is off.
function _M.dict(conf)
    local u = conf.usage
    return u and ngx.shared[u.dict]
end

-- The counter names of a key (by key prefix and key id, a per-worker
-- memo): `who` the part they share, `a` and `r` the admitted and refused
-- counters of the second `at` (made again when the second changes).
local counter_names = memo.new(10000)
local function new_names(prefix, key_id)
    return { who = prefix .. SEP .. key_id .. SEP, at = -1, a = false, r = false }
end

--- Log phase of an ordinary request: counts it for its key (one counter
--- when admitted, one more when refused; no Redis).
function _M.count(conf, state)
    local d, ident = _M.dict(conf), state.ident
    local key_id = d and ident and ident.attrs.key_id
    if type(key_id) ~= "string" then
        return
    end
    local now = ngx.time()
    local admitted = ADMITTED[state.decision]
    local n = counter_names:peek(conf.key_prefix, key_id)
        or counter_names:get(conf.key_prefix, key_id, new_names)
    if n.at ~= now then
        n.at, n.a, n.r = now, "a" .. SEP .. n.who .. now, "r" .. SEP .. n.who .. now
    end
    metrics.add(d, admitted and n.a or n.r, 1, SERIES + 1)
    if not admitted then
        metrics.add(d, "x" .. SEP .. n.who .. state.decision .. SEP .. math.floor(now / 60), 1,
            (REFUSAL_MINUTES + 1) * 60)
    end
end

--- The node's counters of `key_id` (under `prefix`) in dict `d` at second
--- `now`: the per-second admitted and refused series (oldest first), the
--- refusals of the last minutes by reason, and their total.
function _M.counters(d, prefix, key_id, now)
    local admitted, refused = {}, {}
    local who = prefix .. SEP .. key_id .. SEP
    for i = 1, SERIES do
        local t = now - SERIES + i
        admitted[i] = d:get("a" .. SEP .. who .. t) or 0
        refused[i] = d:get("r" .. SEP .. who .. t) or 0
    end
    local by_reason, total = {}, 0
    local minute = math.floor(now / 60)
    for _, reason in ipairs(_M.REASONS) do
        local n = 0
        for m = minute - REFUSAL_MINUTES + 1, minute do
            n = n + (d:get("x" .. SEP .. who .. reason .. SEP .. m) or 0)
        end
        if n > 0 then
            by_reason[reason] = n
            total = total + n
        end
    end
    return admitted, refused, by_reason, total
end

return _M
