-- resty.rl.base.hotpath: helpers of a request's hot path (the access phase
-- of a rule policy), so that LuaJIT compiles it.
--
-- Loops over the short lists of a request (its entries, the rules, a
-- scope's attributes) that handle one item without a loop. Why: LuaJIT
-- counts every execution of a loop, also one that runs once per
-- request. Once hot, it starts a trace at the loop, which the loop
-- leaves at once; after a few such aborts the loop is blacklisted, and a
-- blacklisted loop aborts every trace that reaches it. A hot path with
-- one-pass loops (the access phase of a one-rule policy) then runs in
-- the interpreter. With one item these helpers make a plain call; with
-- none the loop is not entered (not counted).

local _M = {}

--- `new_table(narr, nhash)`: a table with room for `narr` array items and
--- `nhash` fields (LuaJIT's table.new; a plain table elsewhere), so that
--- filling it in does not resize it.
do
    local ok, new_tab = pcall(require, "table.new")
    _M.new_table = ok and new_tab or function()
        return {}
    end
end

--- The item of a list of one item, else nil (none, or more): read
--- without `#list`, which a compiled trace computes by a call into
--- LuaJIT's runtime (lj_tab_len), where two reads of the list compile to
--- a few instructions.
local function single(list)
    local item = list[1]
    if item ~= nil and list[2] == nil then
        return item
    end
    return nil
end
_M.single = single

-- Calls `f(list[i], i, a, b, c, d, x)` for the items in order; returns
-- the first result that is not nil (with its second value), at once
-- when `stop`, else after every item.
local function walk(list, stop, f, a, b, c, d, x)
    local item = list[1]
    if item == nil then
        return nil
    end
    if list[2] == nil then
        return f(item, 1, a, b, c, d, x)
    end
    local first, second
    for i = 1, #list do
        local r, r2 = f(list[i], i, a, b, c, d, x)
        if r ~= nil and first == nil then
            if stop then
                return r, r2
            end
            first, second = r, r2
        end
    end
    return first, second
end

--- Calls `f(list[i], i, a, b, c, d, x)` for each item in order; stops at,
--- and returns, the first result that is not nil (with its second value).
function _M.first_of(list, f, a, b, c, d, x)
    return walk(list, true, f, a, b, c, d, x)
end

--- Calls `f(list[i], i, a, b, c, d, x)` for every item in order; returns
--- the first result that is not nil (with its second value).
function _M.each(list, f, a, b, c, d, x)
    return walk(list, false, f, a, b, c, d, x)
end

--- An empty table shared by the requests that have nothing to put in it
--- (`what` names it in the error): writing into it raises an error
--- rather than leaking into every other request. Made once, at load.
function _M.shared_empty(what)
    return setmetatable({}, { __newindex = function()
        error("rl: the shared empty " .. what .. " is read-only")
    end })
end

--- A per-worker pool of at most `max` tables given back after their
--- request for the next ones to reuse: `take()` one (nil when there is
--- none), `give(t)` one back (false, and `t` not kept, when the pool is
--- full).
function _M.pool(max)
    local items, n = {}, 0
    local function take()
        if n == 0 then
            return nil
        end
        local t = items[n]
        items[n], n = nil, n - 1
        return t
    end
    local function give(t)
        if n >= max then
            return false
        end
        n = n + 1
        items[n] = t
        return true
    end
    return take, give
end

return _M
