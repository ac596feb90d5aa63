-- The unit tests' assertions and runner (gateway/test/unit/run.sh starts
-- nginx, whose init_by_lua calls main with the test files).
--
-- A test file registers named tests and table tests, then main runs them:
--
--   local T = require "unit"
--   T.test("a name", function() T.eq(f(1), 2) end)
--   T.cases("a table test", { { name = "one case", input = 1, want = 2 }, ... },
--       function(c) T.eq(f(c.input), c.want) end)
--
-- A test fails when it raises (an assertion, or any error); the others
-- still run. main prints each failure, then "N passed, N failed" on its
-- own line, and ends the process: status 0 when nothing failed, else 1.

local _M = {}

-- The tests registered by the file being loaded: {name, fn} in order.
local registered

--- Registers the test `name`: `fn()` must not raise.
function _M.test(name, fn)
    registered[#registered + 1] = { name = name, fn = fn }
end

--- Registers one test per case of `cases` (each a table with a `name`),
--- named "<name>: <case name>", running `fn(case)`.
function _M.cases(name, cases, fn)
    for i, c in ipairs(cases) do
        local case_name = c.name or ("case " .. i)
        _M.test(name .. ": " .. case_name, function() fn(c) end)
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

-- The file name of a path (what failures are reported under).
local function base(path)
    return (path:match("([^/]+)$") or path)
end

-- Loads and runs the tests of `path`; returns passed, failed.
local function run_file(path, out, verbose, filter)
    registered = {}
    -- named by the file's name in error messages ("x_test.lua:12: ...")
    local f, err = io.open(path, "rb")
    local chunk
    if f then
        chunk, err = loadstring(f:read("*a"), "@" .. base(path))
        f:close()
    end
    if chunk then
        local ok, e = pcall(chunk)
        err = not ok and e or nil
    end
    if err then
        out:write("FAIL ", base(path), ": loading: ", tostring(err), "\n")
        return 0, 1
    end
    local passed, failed = 0, 0
    for _, t in ipairs(registered) do
        if not filter or t.name:find(filter, 1, true) then
            local ok, e = xpcall(t.fn, function(m)
                -- an assertion's message, or an error with where it came
                -- from (paths of the library shown from gateway/)
                m = type(m) == "string" and m or show(m)
                return (m:gsub(_M.gateway_dir:gsub("%p", "%%%0") .. "/", "gateway/"))
            end)
            if ok then
                passed = passed + 1
                if verbose then
                    out:write("ok   ", base(path), ": ", t.name, "\n")
                end
            else
                failed = failed + 1
                out:write("FAIL ", base(path), ": ", t.name, "\n      ", tostring(e), "\n")
            end
        end
    end
    return passed, failed
end

--- The gateway/ directory (given to main): for the tests that load the
--- shipped policies.
_M.gateway_dir = nil

--- Runs the tests of every file of `files` (paths) of the `gateway_dir`
--- checkout, prints the failures and "N passed, N failed", and ends the
--- process (status 1 on any failure). RL_UNIT_VERBOSE=1 lists every
--- test; RL_UNIT_FILTER runs only the tests whose name contains it.
function _M.main(gateway_dir, files)
    _M.gateway_dir = gateway_dir
    local out = io.stdout
    local verbose = os.getenv("RL_UNIT_VERBOSE") == "1"
    local filter = os.getenv("RL_UNIT_FILTER")
    if filter == "" then
        filter = nil
    end
    local passed, failed = 0, 0
    local ok, err = pcall(function()
        for _, path in ipairs(files) do
            local p, f = run_file(path, out, verbose, filter)
            passed, failed = passed + p, failed + f
        end
    end)
    if not ok then
        out:write("FAIL runner: ", tostring(err), "\n")
        failed = failed + 1
    end
    if #files == 0 then
        out:write("FAIL runner: no test files\n")
        failed = failed + 1
    end
    out:write(passed, " passed, ", failed, " failed\n")
    out:flush()
    -- the tests ran in nginx's init_by_lua: end the process here, before
    -- it would open its ports and serve
    os.exit(failed == 0 and 0 or 1)
end

return _M
