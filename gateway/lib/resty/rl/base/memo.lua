-- resty.rl.base.memo: per-worker memos of values made from two keys (a name
-- and a tier, a rule and a scope value, ...), so that the hot path of a
-- rule policy (resty.rl.decide.engine) makes each once; each memo lives in the
-- module that uses it. Bounded: past `max` values a memo starts over.

local _M = {}

local Memo = {}
Memo.__index = Memo

local WEAK_KEYS = { __mode = "k" }

--- A memo of at most `max` values; with `weak`, its first keys are weak
--- (tables such as rules: a configuration dropped takes its values along).
function _M.new(max, weak)
    -- (peek and get in the memo's own fields: a method found through the
    -- metatable costs each call a failed lookup in the memo first)
    local m = setmetatable({ max = max, n = 0, weak = weak, t = false, peek = Memo.peek,
                             get = Memo.get }, Memo)
    m.t = weak and setmetatable({}, WEAK_KEYS) or {}
    return m
end

--- The value of (`a`, `b`) when it was made before, else nil. The hot
--- path reads with peek and calls get only when it gives nil: a function
--- with both paths, hot first on a miss (early, or LuaJIT's hot counters
--- drained by the configuration's loops), gets a trace through `make`
--- (a string.gsub, ...) that the traces calling it stop and link to
--- rather than compile through.
function Memo:peek(a, b)
    local inner = self.t[a]
    return inner and inner[b]
end

--- The value of (`a`, `b`): `make(a, b, x, y)` the first time.
function Memo:get(a, b, make, x, y)
    local inner = self.t[a]
    if not inner then
        inner = {}
        self.t[a] = inner
    end
    local v = inner[b]
    if v == nil then
        v = make(a, b, x, y)
        if self.n >= self.max then
            self.t, self.n = self.weak and setmetatable({}, WEAK_KEYS) or {}, 0
            inner = {}
            self.t[a] = inner
        end
        inner[b], self.n = v, self.n + 1
    end
    return v
end

return _M
