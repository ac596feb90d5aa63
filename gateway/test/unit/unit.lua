-- The unit tests' assertions, and their registration as busted tests
-- (gateway/test/unit/run.sh runs the files with busted under LuaJIT, the
-- `ngx` API stubbed by ngx_stub.lua).
--
-- A test file registers named tests and table tests:
--
--   local T = require "unit"
--   T.test("a name", function() T.eq(f(1), 2) end)
--   T.cases("a table test", { { name = "one case", input = 1, want = 2 }, ... },
--       function(c) T.eq(f(c.input), c.want) end)
--
-- A test fails when it raises (an assertion, or any error); the others
-- still run.

local _M = {}

-- busted's `it` of the test file calling us (busted gives each test file
-- its own environment): `level` 2 is our caller.
local function busted_it(level)
    local it = getfenv(level + 1).it
    if not it then
        error("unit: the tests run under busted (gateway/test/unit/run.sh)", level + 1)
    end
    return it
end

--- Registers the test `name` (busted's `it`): `fn()` must not raise.
function _M.test(name, fn)
    busted_it(2)(name, fn)
end

--- Registers one test per case of `cases` (each a table with a `name`),
--- named "<name>: <case name>", running `fn(case)`.
function _M.cases(name, cases, fn)
    local it = busted_it(2)
    for i, c in ipairs(cases) do
        local case_name = c.name or ("case " .. i)
        it(name .. ": " .. case_name, function() fn(c) end)
    end
end

-- Escapes of a shown string's special bytes.
local ESCAPES = { ["\r"] = "\\r", ["\n"] = "\\n", ["\t"] = "\\t", ['"'] = '\\"',
                  ["\\"] = "\\\\" }
local function escape(ch)
    return ESCAPES[ch] or string.format("\\%03d", ch:byte())
end

-- A readable, deterministic form of `v` (strings quoted with their
-- control bytes escaped, table keys sorted).
local function show(v, depth)
    depth = depth or 0
    if type(v) == "string" then
        return '"' .. v:gsub('[%c"\\]', escape) .. '"'
    end
    if type(v) ~= "table" or depth > 6 then
        return tostring(v)
    end
    local keys = {}
    for k in pairs(v) do
        keys[#keys + 1] = k
    end
    table.sort(keys, function(a, b)
        if type(a) == type(b) and (type(a) == "number" or type(a) == "string") then
            return a < b
        end
        return type(a) < type(b)
    end)
    local parts, n = {}, #v
    for _, k in ipairs(keys) do
        local item = show(v[k], depth + 1)
        if type(k) == "number" and k >= 1 and k <= n and k % 1 == 0 then
            parts[#parts + 1] = item
        else
            parts[#parts + 1] = (type(k) == "string" and k:match("^[%a_][%w_]*$") and k
                or "[" .. show(k) .. "]") .. " = " .. item
        end
    end
    return "{ " .. table.concat(parts, ", ") .. " }"
end
_M.show = show

-- Are `a` and `b` equal, tables compared member by member?
local function same(a, b)
    if type(a) ~= "table" or type(b) ~= "table" then
        return a == b
    end
    for k, v in pairs(a) do
        if not same(v, b[k]) then
            return false
        end
    end
    for k in pairs(b) do
        if a[k] == nil then
            return false
        end
    end
    return true
end

-- Raises `msg` at the test's line (the caller of the assertion).
local function fail(msg, what)
    error((what and (what .. ": ") or "") .. msg, 3)
end

--- `got` equals `want` (tables member by member); `what` names the value.
function _M.eq(got, want, what)
    if not same(got, want) then
        fail("got " .. show(got) .. "\n      want " .. show(want), what)
    end
end

--- `cond` is true.
function _M.ok(cond, what)
    if not cond then
        fail("not true", what)
    end
end

--- `fn()` raises an error whose message contains `part` (as it is);
--- returns the message.
function _M.raises(fn, part, what)
    local ok, err = pcall(fn)
    if ok then
        fail("no error (wanted one containing " .. show(part) .. ")", what)
    end
    err = tostring(err)
    if not err:find(part, 1, true) then
        fail("error " .. show(err) .. "\n      does not contain " .. show(part), what)
    end
    return err
end

--- The test of a table of bad inputs: for each case, `base()` makes a
--- fresh good input, the case's `mod(input)` spoils it, and `build(input)`
--- must raise an error containing `prefix` then the case's `err`.
function _M.refusing(base, build, prefix)
    return function(c)
        local input = base()
        c.mod(input)
        _M.raises(function() build(input) end, (prefix or "") .. c.err)
    end
end

--- The gateway/ directory of this checkout: for the tests that load the
--- shipped policies.
_M.gateway_dir = (debug.getinfo(1, "S").source:match("^@(.*)/test/unit/[^/]*$"))

return _M
