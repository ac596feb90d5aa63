-- resty.rl.base.hotpath: the walks over a request's short lists and the one
-- item of a list, read without `#list`.
local T = require "unit"
local hotpath = require "resty.rl.base.hotpath"

T.cases("single is the item of a list of one item, else nil", {
    { name = "none", list = {}, want = nil },
    { name = "one", list = { "a" }, want = "a" },
    { name = "two", list = { "a", "b" }, want = nil },
    { name = "three", list = { "a", "b", "c" }, want = nil },
    { name = "one false item", list = { false }, want = false },
}, function(c)
    T.eq(hotpath.single(c.list), c.want)
end)

-- The calls of a walk: "<item>@<index>" each, in order.
local function walk_calls(walk, list, stop_at)
    local seen = {}
    local r, r2 = walk(list, function(item, i, tag)
        seen[#seen + 1] = item .. "@" .. i .. tag
        if item == stop_at then
            return "found " .. item, i
        end
    end, "!")
    return table.concat(seen, " "), r, r2
end

T.cases("first_of stops at the first result, each calls every item", {
    { name = "first_of, none", walk = "first_of", list = {}, want = "" },
    { name = "first_of, one", walk = "first_of", list = { "a" }, want = "a@1!" },
    { name = "first_of, one found", walk = "first_of", list = { "a" }, stop = "a",
      want = "a@1!", r = "found a", r2 = 1 },
    { name = "first_of, stops", walk = "first_of", list = { "a", "b", "c" }, stop = "b",
      want = "a@1! b@2!", r = "found b", r2 = 2 },
    { name = "each, none", walk = "each", list = {}, want = "" },
    { name = "each, every item", walk = "each", list = { "a", "b", "c" }, stop = "b",
      want = "a@1! b@2! c@3!", r = "found b", r2 = 2 },
    { name = "each, no result", walk = "each", list = { "a", "b" }, want = "a@1! b@2!" },
}, function(c)
    local calls, r, r2 = walk_calls(hotpath[c.walk], c.list, c.stop)
    T.eq(calls, c.want)
    T.eq(r, c.r)
    T.eq(r2, c.r2)
end)
