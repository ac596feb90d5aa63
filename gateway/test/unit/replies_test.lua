-- Limiter replies read and decoded: resty.rl.redis.client's byte-level reader of
-- integer arrays (int_array, and send's reads off a socket), the 8-integer
-- decoder and the lease decoder (resty.rl.redis.commands), and the outcomes the
-- limiter kinds make of them (resty.rl.limit.limiters, resty.rl.limit.distinct).
local T = require "unit"
local connection = require "resty.rl.redis.connection"
local commands = require "resty.rl.redis.commands"
local limiters = require "resty.rl.limit.limiters"

local null = ngx.null

-- Replies in the module's RESP form: [status, limit, remaining, reset_ms,
-- retry_after_ms, box_level, strikes_remaining, binding].
local REPLIES = {
    { name = "allowed", resp = "*8\r\n:1\r\n:10\r\n:9\r\n:6000\r\n:-1\r\n:0\r\n:-1\r\n:0\r\n",
      ints = { 1, 10, 9, 6000, -1, 0, -1, 0 } },
    { name = "refused by the ALSO bucket, strikes left",
      resp = "*8\r\n:0\r\n:600\r\n:0\r\n:60000\r\n:1234\r\n:0\r\n:19\r\n:1\r\n",
      ints = { 0, 600, 0, 60000, 1234, 0, 19, 1 } },
    { name = "boxed at level 3 (manual: no reset, no retry)",
      resp = "*8\r\n:-1\r\n:50\r\n:0\r\n:-1\r\n:-1\r\n:3\r\n:0\r\n:0\r\n",
      ints = { -1, 50, 0, -1, -1, 3, 0, 0 } },
    { name = "delayed (a wait of 250 ms)",
      resp = "*8\r\n:2\r\n:4\r\n:0\r\n:250\r\n:250\r\n:0\r\n:-1\r\n:0\r\n",
      ints = { 2, 4, 0, 250, 250, 0, -1, 0 } },
}

T.cases("a whole reply gives its integers", REPLIES, function(c)
    T.eq(connection.int_array(c.resp, 8), c.ints, "with n = 8")
    T.eq(connection.int_array(c.resp), c.ints, "as many as it says")
    T.eq(connection.int_array(c.resp, 7), nil, "with n = 7")
end)

T.cases("every prefix of a reply (not complete yet) gives nothing", REPLIES, function(c)
    for i = 0, #c.resp - 1 do
        T.eq(connection.int_array(c.resp:sub(1, i), 8), nil, "the first " .. i .. " bytes")
    end
end)

T.cases("a mangled reply gives nothing", REPLIES, function(c)
    T.eq(connection.int_array(c.resp .. ":1\r\n", 8), nil, "one element too many")
    T.eq(connection.int_array(c.resp .. ":1\r\n"), nil, "one element more than it says")
    T.eq(connection.int_array((c.resp:gsub("^%*8", "*7")), 8), nil, "*7 with 8 elements")
    T.eq(connection.int_array((c.resp:gsub("^%*8", "*9")), 8), nil, "*9 with 8 elements")
    T.eq(connection.int_array(c.resp .. "x", 8), nil, "a byte after the end")
    T.eq(connection.int_array((c.resp:gsub("\r\n$", "\n")), 8), nil, "the last CR missing")
    -- each digit after "*8" turned into a letter, each ":" into "+"
    -- (a simple string), each CR and each LF into a space
    local swaps = { ["%d"] = "x", [":"] = "+", ["\r"] = " ", ["\n"] = " " }
    for i = 3, #c.resp do
        for class, by in pairs(swaps) do
            if c.resp:sub(i, i):match(class) then
                local bad = c.resp:sub(1, i - 1) .. by .. c.resp:sub(i + 1)
                T.eq(connection.int_array(bad, 8), nil, T.show(bad))
            end
        end
    end
end)

T.cases("other shapes give nothing", {
    { name = "empty", buf = "" },
    { name = "an error reply", buf = "-ERR wrong number of arguments\r\n" },
    { name = "a simple string", buf = "+OK\r\n" },
    { name = "a bulk string element", buf = "*1\r\n$1\r\n1\r\n" },
    { name = "a plus sign", buf = "*1\r\n:+1\r\n" },
    { name = "an empty integer", buf = "*1\r\n:\r\n" },
    { name = "a lone minus", buf = "*1\r\n:-\r\n" },
    { name = "no count", buf = "*\r\n:1\r\n" },
    { name = "a negative count (a null array)", buf = "*-1\r\n" },
    { name = "LF without CR", buf = "*1\n:1\n" },
    { name = "more than 64 integers", buf = "*65\r\n" .. string.rep(":1\r\n", 65) },
    { name = "a nested array", buf = "*1\r\n*1\r\n:1\r\n" },
}, function(c)
    T.eq(connection.int_array(c.buf), nil)
end)

T.cases("edge values", {
    { name = "an empty array", buf = "*0\r\n", n = 0, want = {} },
    { name = "64 integers", buf = "*64\r\n" .. string.rep(":7\r\n", 64), want = (function()
        local t = {}
        for i = 1, 64 do
            t[i] = 7
        end
        return t
    end)() },
    { name = "minus zero", buf = "*1\r\n:-0\r\n", want = { 0 } },
    { name = "a large integer", buf = "*2\r\n:9007199254740992\r\n:-1099511627776\r\n",
      want = { 9007199254740992, -1099511627776 } },
}, function(c)
    T.eq(connection.int_array(c.buf, c.n), c.want)
end)

-- A socket that answers `chunks` one per receiveany (then a timeout), and
-- records what was sent; a connection over it that records its close.
local function fake_connection(chunks)
    local sock = { sent = {}, reads = 0 }
    function sock:send(data)
        self.sent[#self.sent + 1] = data
        return #data
    end
    function sock:receiveany(_max)
        self.reads = self.reads + 1
        local c = chunks[self.reads]
        if c == nil then
            return nil, "timeout"
        end
        return c
    end
    local red = { _sock = sock, closed = false }
    function red:close()
        self.closed = true
    end
    return red, sock
end

-- The cuts of `s` into pieces of `size` bytes.
local function pieces(s, size)
    local out = {}
    for i = 1, #s, size do
        out[#out + 1] = s:sub(i, i + size - 1)
    end
    return out
end

local ALLOWED = REPLIES[1]

T.test("send: a limiter command alone is sent as encoded and read in one piece", function()
    local cmd = commands.encoded({ "RL.TAKE", "rl:{k}", 10, 1, 60 }, 8)
    local red, sock = fake_connection({ ALLOWED.resp })
    T.eq(connection.send(red, { cmd }), { ALLOWED.ints })
    T.eq(sock.sent, { "*5\r\n$7\r\nRL.TAKE\r\n$6\r\nrl:{k}\r\n$2\r\n10\r\n$1\r\n1\r\n$2\r\n60\r\n" })
    T.eq(sock.reads, 1)
    T.ok(not red.closed, "kept open (back into the pool)")
end)

T.cases("send: a reply cut across reads is put together", REPLIES, function(c)
    local cmd = commands.encoded({ "RL.TAKE", "k", 10, 1, 60 }, 8)
    for cut = 1, #c.resp - 1 do
        local red = fake_connection({ c.resp:sub(1, cut), c.resp:sub(cut + 1) })
        T.eq(connection.send(red, { cmd }), { c.ints }, "cut at byte " .. cut)
    end
    local red = fake_connection(pieces(c.resp, 5))
    T.eq(connection.send(red, { cmd }), { c.ints }, "in pieces of 5 bytes")
end)

T.cases("send: failures close the connection", {
    { name = "an error reply is the command's reply",
      chunks = { "-ERR wrong number", " of arguments\r\n" },
      want = { { false, "ERR wrong number of arguments" } }, closed = false },
    { name = "a timeout after part of a reply", chunks = { "*8\r\n:1\r\n:10\r\n" },
      err = "timeout", closed = true },
    { name = "a mangled reply is no reply",
      chunks = { (ALLOWED.resp:gsub(":9\r\n", ":x\r\n")) }, err = "unexpected reply",
      closed = true },
    { name = "one element too many", chunks = { ALLOWED.resp .. ":1\r\n" },
      err = "unexpected reply", closed = true },
    { name = "another shape", chunks = { "*4\r\n$1\r\na\r\n$1\r\nb\r\n", "$1\r\nc\r\n$1\r\nd\r\n" },
      err = "unexpected reply", closed = true },
    { name = "reads are bounded (16)", chunks = pieces(ALLOWED.resp, 1),
      err = "unexpected reply", closed = true },
}, function(c)
    local cmd = commands.encoded({ "RL.TAKE", "k", 10, 1, 60 }, 8)
    local red = fake_connection(c.chunks)
    local res, err = connection.send(red, { cmd })
    T.eq(res, c.want, "the replies")
    T.eq(err, c.err, "the error")
    T.eq(red.closed, c.closed, "closed")
end)

T.cases("decode: the 8-integer reply as named fields", {
    { name = "allowed", res = REPLIES[1].ints,
      want = { status = 1, limit = 10, remaining = 9, reset_ms = 6000, box_level = 0,
               binding = 0, name = false } },
    { name = "refused by the second bucket", res = REPLIES[2].ints,
      want = { status = 0, limit = 600, remaining = 0, reset_ms = 60000, retry_after_ms = 1234,
               box_level = 0, strikes_remaining = 19, binding = 1, name = false } },
    { name = "a manual box: no reset, no retry", res = REPLIES[3].ints,
      want = { status = -1, limit = 50, remaining = 0, box_level = 3, strikes_remaining = 0,
               binding = 0, name = false } },
    { name = "seven integers", res = { 1, 10, 9, 6000, -1, 0, -1 }, want = nil },
    { name = "nine integers", res = { 1, 10, 9, 6000, -1, 0, -1, 0, 0 }, want = nil },
    { name = "a string among them", res = { 1, 10, "9", 6000, -1, 0, -1, 0 }, want = nil },
    { name = "a null among them", res = { 1, 10, null, 6000, -1, 0, -1, 0 }, want = nil },
    { name = "an error reply", res = { false, "ERR no such key" }, want = nil },
    { name = "a string", res = "OK", want = nil },
    { name = "nothing", res = nil, want = nil },
}, function(c)
    T.eq(commands.decode(c.res), c.want)
end)

T.cases("decode_lease: RL.LEASE ACQUIRE's reply", {
    { name = "granted", res = { 1, "req-1", 1, 2, 0 },
      want = { granted = true, lease_id = "req-1", in_use = 1, max = 2, retry_after_ms = 0 } },
    { name = "full", res = { 0, null, 2, 2, 4000 },
      want = { granted = false, in_use = 2, max = 2, retry_after_ms = 4000 } },
    { name = "granted without an id is not granted", res = { 1, null, 1, 2, 0 },
      want = { granted = false, in_use = 1, max = 2, retry_after_ms = 0 } },
    { name = "four elements", res = { 1, "a", 1, 2 }, want = nil },
    { name = "in_use not a number", res = { 1, "a", "1", 2, 0 }, want = nil },
    { name = "an error reply", res = { false, "ERR max" }, want = nil },
    { name = "nothing", res = nil, want = nil },
}, function(c)
    T.eq(commands.decode_lease(c.res), c.want)
end)

-- An entry of a rule policy as resty.rl.decide.matching makes it (the fields an
-- outcome reads).
local function entry(params, over)
    local e = { params = params, name = "free", also_names = { "free-tenant" },
                rule = { unit = "requests" }, probe = false, cost = 1 }
    for k, v in pairs(over or {}) do
        e[k] = v
    end
    return e
end
local BUCKET = { kind = "bucket", rate = 10, burst = 10, period = 60,
                 also = { { rate = 600, burst = 600, period = 3600 } } }
local WINDOW = { kind = "window", limit = 5, window = 30, mode = "sliding" }

T.cases("rate outcomes", {
    { name = "allowed", e = entry(BUCKET), raw = REPLIES[1].ints,
      want = { state = "allowed", level = 0, binding = { name = "free", limit = 10,
               remaining = 9, reset_ms = 6000, window = 60, unit = "requests", clamp = false } } },
    { name = "refused by the ALSO bucket: its name and period", e = entry(BUCKET),
      raw = REPLIES[2].ints,
      want = { state = "refused", retry_ms = 1234, level = 0, strikes = 19,
               binding = { name = "free-tenant", limit = 600, remaining = 0, reset_ms = 60000,
                           window = 3600, unit = "requests", clamp = false } } },
    { name = "boxed: nothing remaining", e = entry(BUCKET), raw = REPLIES[3].ints,
      want = { state = "boxed", level = 3, strikes = 0, binding = { name = "free", limit = 50,
               remaining = 0, window = 60, unit = "requests", clamp = false, boxed = true } } },
    { name = "delayed", e = entry({ kind = "bucket", rate = 4, burst = 4, period = 1 }),
      raw = REPLIES[4].ints,
      want = { state = "delayed", retry_ms = 250, level = 0, binding = { name = "free",
               limit = 4, remaining = 0, reset_ms = 250, window = 1, unit = "requests",
               clamp = false } } },
    { name = "a window clamps its t", e = entry(WINDOW), raw = { 1, 5, 4, 30000, -1, 0, -1, 0 },
      want = { state = "allowed", level = 0, binding = { name = "free", limit = 5,
               remaining = 4, reset_ms = 30000, window = 30, unit = "requests", clamp = true } } },
    { name = "a probe with no failure left is refused until the reset",
      e = entry(WINDOW, { probe = true }), raw = { 1, 5, 0, 12000, -1, 0, -1, 0 },
      want = { state = "refused", retry_ms = 12000, level = 0, binding = { name = "free",
               limit = 5, remaining = 0, reset_ms = 12000, window = 30, unit = "requests",
               clamp = true } } },
    { name = "a probe refused waits at most the window",
      e = entry(WINDOW, { probe = true }), raw = { 1, 5, 0, 50000, -1, 0, -1, 0 },
      want = { state = "refused", retry_ms = 30000, level = 0, binding = { name = "free",
               limit = 5, remaining = 0, reset_ms = 50000, window = 30, unit = "requests",
               clamp = true } } },
    { name = "a quota's window is its period",
      e = entry({ kind = "quota", limit = 100, period = "DAY" }),
      raw = { 0, 100, 0, 5000, 5000, 0, -1, 0 },
      want = { state = "refused", retry_ms = 5000, level = 0, binding = { name = "free",
               limit = 100, remaining = 0, reset_ms = 5000, window = 86400, unit = "requests",
               clamp = true } } },
}, function(c)
    local o, err = limiters.KINDS[c.e.params.kind].outcome(c.e, c.raw)
    T.eq(err, nil, "no error")
    -- its own binding (one table): `want` with its binding's fields in it
    T.eq(o.binding == o, true, "its own binding")
    local got, want = {}, {}
    for k, v in pairs(o) do
        got[k] = v
    end
    for k, v in pairs(c.want) do
        want[k] = v
    end
    got.binding, want.binding = nil, nil
    -- (boxed: false until a box sets it)
    got.boxed = got.boxed or nil
    for k, v in pairs(c.want.binding) do
        want[k] = v
    end
    T.eq(got, want)
end)

T.cases("an unusable reply is an error", {
    { name = "an error reply", raw = { false, "ERR cost exceeds burst" },
      err = "unexpected reply: ERR cost exceeds burst" },
    { name = "seven integers", raw = { 1, 2, 3, 4, 5, 6, 7 },
      err = "unexpected reply: 2" },
    { name = "a string", raw = "OK", err = "unexpected reply: OK" },
}, function(c)
    for _, kind in ipairs({ "bucket", "window", "quota", "distinct", "lease" }) do
        local o, err = limiters.KINDS[kind].outcome(entry({ kind = kind, max = 1, ttl = 1 }),
            c.raw)
        T.eq(o, nil, kind)
        T.eq(err, c.err, kind)
    end
end)

T.cases("distinct outcomes", {
    { name = "allowed", raw = { 1, 2, 1, 60000, -1, 0, -1, 0 },
      want = { state = "allowed", level = 0, binding = { name = "free", limit = 2, remaining = 1,
               reset_ms = 60000, window = 600, unit = "members", clamp = true } } },
    { name = "refused", raw = { 0, 2, 0, 60000, 60000, 0, -1, 0 },
      want = { state = "refused", retry_ms = 60000, level = 0, binding = { name = "free",
               limit = 2, remaining = 0, reset_ms = 60000, window = 600, unit = "members",
               clamp = true } } },
    { name = "a probe with min_events is not refused by the count alone",
      probe = true, min_events = 7, raw = { 0, 2, 0, 60000, 60000, 0, -1, 0 },
      want = { state = "allowed", level = 0, binding = { name = "free", limit = 2,
               remaining = 0, reset_ms = 60000, window = 600, unit = "members", clamp = true } } },
    { name = "boxed", raw = { -1, 2, 0, 86400000, 86400000, 3, -1, 0 },
      want = { state = "boxed", retry_ms = 86400000, level = 3, binding = { name = "free",
               limit = 2, remaining = 0, reset_ms = 86400000, window = 600, unit = "members",
               clamp = true, boxed = true } } },
}, function(c)
    local e = entry({ kind = "distinct", limit = 2, window = 600, min_events = c.min_events },
        { probe = c.probe or false, rule = { unit = "members" } })
    T.eq(limiters.KINDS.distinct.outcome(e, c.raw), c.want)
end)

T.cases("lease outcomes", {
    { name = "granted", raw = { 1, "req-1", 1, 2, 0 },
      want = { state = "allowed", concurrency = 2, binding = { name = "free", limit = 2,
               remaining = 1, unit = "concurrent-requests" } } },
    { name = "full: Retry-After from the expected duration, not the ttl",
      raw = { 0, null, 2, 2, 298000 },
      want = { state = "refused", retry_ms = 3000, concurrency = 2, binding = { name = "free",
               limit = 2, remaining = 0, unit = "concurrent-requests" } } },
}, function(c)
    local e = entry({ kind = "lease", max = 2, ttl = 300, expected = 5 })
    T.eq(limiters.KINDS.lease.outcome(e, c.raw), c.want)
end)

T.cases("lease_retry_ms: the earliest holder's expected end", {
    { name = "started 2 s ago, expected 5 s", ttl = 300, expected = 5, left = 298000,
      want = 3000 },
    { name = "overdue: at least 1 s", ttl = 300, expected = 5, left = 200000, want = 1000 },
    { name = "expected 1 s by default", ttl = 300, left = 299500, want = 1000 },
    { name = "never past the earliest expiry", ttl = 10, expected = 60, left = 4000,
      want = 4000 },
    { name = "an expiry within a second: 1 s", ttl = 10, expected = 60, left = 300,
      want = 1000 },
}, function(c)
    T.eq(limiters.lease_retry_ms(c.ttl, c.expected, c.left), c.want)
end)

T.cases("a quota's window is its calendar period's length (UTC)", {
    { name = "a day", period = "DAY", now = 1707998400, want = 86400 },
    { name = "a week", period = "WEEK", now = 1707998400, want = 7 * 86400 },
    { name = "February of a leap year", period = "MONTH", now = 1707998400, want = 29 * 86400 },
    { name = "the last second of February 2023", period = "MONTH", now = 1677628799,
      want = 28 * 86400 },
    { name = "February 2100 (no leap day)", period = "MONTH", now = 4105900800,
      want = 28 * 86400 },
    { name = "February 2000 (a leap day)", period = "MONTH", now = 951782400, want = 29 * 86400 },
    { name = "April", period = "MONTH", now = 1775779200, want = 30 * 86400 },
    { name = "the first second of November", period = "MONTH", now = 1793491200,
      want = 30 * 86400 },
    { name = "the last second of December", period = "MONTH", now = 1798761599,
      want = 31 * 86400 },
    { name = "January", period = "MONTH", now = 1769860800, want = 31 * 86400 },
}, function(c)
    -- the clock the library reads, set to the case's time for this call
    local clock = ngx.time
    ngx.time = function() return c.now end
    local ok, got = pcall(limiters.period_seconds, c.period)
    ngx.time = clock
    T.ok(ok, tostring(got))
    T.eq(got, c.want)
end)
