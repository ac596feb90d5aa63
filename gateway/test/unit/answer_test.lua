-- resty.rl.decide.answer: which refusal answers a request that several rules
-- refuse.
local T = require "unit"
local answer = require "resty.rl.decide.answer"

-- An entry of rule `name` refused with a wait of `retry_ms` (nil: no end).
local function refused(name, retry_ms)
    return { rule = { name = name, on_refusal = {} },
             outcome = { state = "refused", retry_ms = retry_ms } }
end

T.cases("the strictest refusal", {
    { name = "the longest wait", entries = { refused("a", 2000), refused("b", 9000) }, want = "b" },
    { name = "no end before any wait", entries = { refused("a", 9000), refused("b", nil) }, want = "b" },
    { name = "waits in the same second: the rule listed first",
      entries = { refused("ledger", 4999), refused("tenant", 5000) }, want = "ledger" },
    { name = "the same, the other way round",
      entries = { refused("tenant", 5000), refused("ledger", 4999) }, want = "tenant" },
    { name = "a second apart", entries = { refused("ledger", 5000), refused("tenant", 5001) }, want = "tenant" },
    { name = "admitted entries are not refusals",
      entries = { { rule = { name = "a", on_refusal = {} }, outcome = { state = "allowed" } },
                  refused("b", 1) }, want = "b" },
}, function(c)
    T.eq(answer.strictest(c.entries).rule.name, c.want)
end)
