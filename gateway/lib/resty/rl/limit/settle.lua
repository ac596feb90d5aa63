-- resty.rl.limit.settle: post-paid charging (`settle` of a rule; gateway/REFERENCE.md,
-- "Post-paid charging"). The rule's `cost` is an estimate, charged before
-- the request as usual; after the response the actual cost is read from
--   from = "header": a response header the upstream sets (`header`),
--   from = "usage":  `usage.total_tokens` of an OpenAI-compatible response,
--                    a JSON body or a stream of server-sent events (the
--                    final `data:` chunk carries the usage), read chunk by
--                    chunk in the body filter,
--   from = "bytes":  the response body's bytes sent (egress),
-- times `scale` (rounded up), and the difference is settled in the log
-- phase's timer: `COST (actual - estimate) DEBT` (never refused: the bucket
-- may go below empty, and the next requests see the debt) or `REFUND
-- (estimate - actual)`. An actual cost that cannot be read leaves the
-- estimate charged (and logs a warning).

local cjson = require "cjson.safe"

local _M = {}

local SOURCES = { header = true, usage = true, bytes = true }
-- The longest SSE line kept while it is incomplete (a longer one is skipped).
local MAX_LINE = 1024 * 1024

--- Validates and completes `r.settle` of rule `r` (limiter `l`) at
--- start; `check(cond, fmt, ...)` raises the configuration error.
function _M.validate(where, r, l, check)
    local s = r.settle
    if s == nil then
        return
    end
    check(type(s) == "table" and SOURCES[s.from],
        "%s: settle.from must be header, usage or bytes", where)
    check(l.kind == "bucket" or l.kind == "window" or l.kind == "quota",
        "%s: settle works with bucket, window and quota limiters", where)
    check((r.count == nil or r.count == "requests") and not l.delay and not r.allowance,
        "%s: settle needs count = requests, no delay and no allowance", where)
    if s.from == "header" then
        check(type(s.header) == "string" and s.header ~= "",
            "%s: settle.header must name the upstream's response header", where)
        s.hide = s.hide ~= false
    end
    s.scale = s.scale or 1
    check(type(s.scale) == "number" and s.scale > 0, "%s: settle.scale must be > 0", where)
    s.max_body = s.max_body or MAX_LINE
    check(type(s.max_body) == "number" and s.max_body >= 1,
        "%s: settle.max_body must be bytes >= 1", where)
end

-- Does `v` make an actual cost (a finite number >= 0)?
local function count(v, scale)
    v = tonumber(v)
    if not v or v ~= v or v < 0 or v == math.huge then
        return nil
    end
    return math.ceil(v * scale - 1e-9)
end

--- Header filter: reads (and hides) the upstream's headers of the
--- settling rules, and decides how the body is read for `usage`.
function _M.header_filter(state)
    if not state.admitted then
        return
    end
    for _, e in ipairs(state.entries) do
        local s = e.rule.settle
        if s and s.from == "header" then
            local v = ngx.header[s.header]
            if type(v) == "table" then
                v = nil
            end
            e.actual = count(v, s.scale)
            if s.hide then
                ngx.header[s.header] = nil
            end
        elseif s and s.from == "usage" and not state.usage then
            local ctype = ngx.header["Content-Type"] or ""
            local coding = ngx.header["Content-Encoding"]
            state.usage = { sse = ctype:find("text/event-stream", 1, true) ~= nil,
                            buf = {}, size = 0, max = s.max_body,
                            -- a compressed body is not read: the estimate stands
                            done = coding ~= nil and coding ~= "identity" }
        end
    end
end

-- The total_tokens of a decoded response or chunk, or nil.
local function tokens_of(doc)
    local u = type(doc) == "table" and doc.usage
    return type(u) == "table" and tonumber(u.total_tokens) or nil
end

-- One complete SSE line: a `data:` line whose JSON carries the usage.
local function sse_line(u, line)
    if line:find("total_tokens", 1, true) then
        local payload = line:match("^data:%s*(.-)%s*$")
        local t = payload and tokens_of(cjson.decode(payload))
        if t then
            u.tokens = t
        end
    end
end

-- An SSE chunk: complete lines are read, the incomplete last one is kept
-- (at most MAX_LINE bytes: a longer line is skipped up to its end).
local function sse_chunk(u, chunk)
    local pos = 1
    while true do
        local nl = chunk:find("\n", pos, true)
        if not nl then
            break
        end
        local piece = chunk:sub(pos, nl - 1)
        if u.skip then
            u.skip = nil
        else
            u.pending = (u.pending or "") .. piece
            sse_line(u, u.pending)
        end
        u.pending = nil
        pos = nl + 1
    end
    if pos <= #chunk and not u.skip then
        u.pending = (u.pending or "") .. chunk:sub(pos)
        if #u.pending > MAX_LINE then
            u.pending, u.skip = nil, true
        end
    end
end

--- Body filter: one chunk of the response (`ngx.arg[1]`, eof `ngx.arg[2]`)
--- read for the usage; the stream passes on untouched. A JSON body is kept
--- up to `max_body` bytes to be decoded at its end; a stream of events is
--- read line by line (only the incomplete line is kept).
function _M.body_filter(state)
    local u = state.usage
    if not u or u.done then
        return
    end
    u.filtered = true
    local chunk, eof = ngx.arg[1], ngx.arg[2]
    if u.sse then
        if chunk and chunk ~= "" then
            sse_chunk(u, chunk)
        end
        if eof then
            if u.pending then
                sse_line(u, u.pending)
            end
            u.pending, u.done = nil, true
        end
        return
    end
    if chunk and chunk ~= "" then
        u.size = u.size + #chunk
        if u.size > u.max then
            -- too large to be decoded here: the estimate stands
            u.buf, u.done = nil, true
            return
        end
        u.buf[#u.buf + 1] = chunk
    end
    if eof then
        u.tokens = tokens_of(cjson.decode(table.concat(u.buf)))
        u.buf, u.done = nil, true
    end
end

-- The settling command of `e` for `diff` points (> 0: a debt, < 0: a
-- refund), from the rule's refund command.
local function command(kinds, e, diff)
    local cmd = kinds[e.params.kind].command(e, math.abs(diff), false, nil, true)
    if diff > 0 then
        for i, a in ipairs(cmd) do
            if a == "REFUND" then
                cmd[i] = "COST"
            end
        end
        cmd[#cmd + 1] = "DEBT"
    end
    return cmd
end

--- Log phase: appends to `cmds` the settlement of every admitted rule
--- with `settle` (`kinds`: resty.rl.limit.limiters.KINDS); `bytes`: the body
--- bytes sent; `warn` logs an actual cost that could not be read.
function _M.commands(state, kinds, bytes, warn, cmds)
    for _, e in ipairs(state.entries) do
        local s = e.rule.settle
        local o = e.outcome
        if s and o and o.state == "allowed" and not e.probe then
            local actual = e.actual
            if s.from == "usage" then
                actual = state.usage and state.usage.tokens
                actual = actual and count(actual, s.scale)
            elseif s.from == "bytes" then
                actual = count(bytes or 0, s.scale)
            end
            if not actual then
                -- a body that was not read: no body_filter_by_lua in the location
                local unread = s.from == "usage" and state.usage and not state.usage.done
                    and not state.usage.filtered
                warn("rl: " .. e.name .. ": no actual cost in the response (" .. s.from
                    .. (unread and ": the body was not read, settle.from = \"usage\" needs "
                        .. "body_filter_by_lua" or "") .. "); the estimate " .. e.cost .. " stands")
            elseif actual ~= e.cost then
                cmds[#cmds + 1] = command(kinds, e, actual - e.cost)
            end
        end
    end
    return cmds
end

return _M
