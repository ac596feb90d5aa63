-- ngx_stub: the part of OpenResty's `ngx` API that the gateway's library
-- uses when it is loaded and called by the unit tests, FOR TESTS ONLY, so
-- that they run in plain LuaJIT (busted's helper: gateway/test/unit/run.sh)
-- without nginx and without Redis.
--
-- What it provides, with nginx's semantics:
--   ngx.null (cjson's null, as in OpenResty), the log levels and ngx.log
--   (kept in ngx_stub.logs; printed to stderr with RL_UNIT_VERBOSE=1);
--   ngx.now / ngx.time / ngx.update_time (a cached clock, refreshed by
--   update_time, as nginx's is); ngx.http_time / ngx.parse_http_time;
--   ngx.md5 / ngx.md5_bin / ngx.sha1_bin (OpenSSL's libcrypto through FFI,
--   loaded with its symbols global, as nginx links it);
--   ngx.encode_base64 / ngx.decode_base64; ngx.shared.DICT for the dicts
--   the sample configuration declares (get/set/add/incr/delete/expire/ttl/
--   get_keys/flush_all, expiry on the process' own clock, not the
--   replaceable ngx.now, as nginx's dicts); ngx.var and ngx.ctx (empty
--   tables); ngx.worker.id/pid/exiting; ngx.get_phase ("init").
-- What it refuses: anything that needs a request, a socket or a timer
-- (ngx.req, ngx.socket, ngx.timer, ngx.thread, ngx.sleep, ngx.exit...):
-- calling one raises "... needs nginx"; `resty.redis` loads as a driver
-- whose every call raises (a unit test must not reach Redis). The tests of
-- those paths start nginx and Redis (tests/gateway*.rs).

local ffi = require "ffi"
local bit = require "bit"
local cjson = require "cjson.safe"

local M = { logs = {} }

ffi.cdef [[
    typedef long stub_time_t;
    struct stub_timeval { stub_time_t tv_sec; long tv_usec; };
    int gettimeofday(struct stub_timeval *tv, void *tz);
    unsigned char *MD5(const unsigned char *d, size_t n, unsigned char *md);
    unsigned char *SHA1(const unsigned char *d, size_t n, unsigned char *md);
]]

-- OpenSSL's libcrypto, its symbols global (in ffi.C), as in nginx, which
-- links it: resty.rl.request.jws and resty.rl.request.identity call it through ffi.C.
local function load_crypto()
    for _, name in ipairs({ "crypto", "libcrypto.so.3", "libcrypto.so.1.1" }) do
        local ok, lib = pcall(ffi.load, name, true)
        if ok then
            return lib
        end
    end
    error("ngx_stub: OpenSSL's libcrypto not found (ngx.md5 and ngx.sha1_bin need it)")
end
local crypto = load_crypto()

local tv = ffi.new("struct stub_timeval")
-- The process' clock: seconds since the epoch, with milliseconds.
local function clock()
    ffi.C.gettimeofday(tv, nil)
    return tonumber(tv.tv_sec) + math.floor(tonumber(tv.tv_usec) / 1000) / 1000
end

local function needs_nginx(name)
    return function()
        error(name .. " needs nginx (ngx_stub covers the unit tests' API only)", 2)
    end
end

-- A table whose every field is a function that raises "<prefix>.<field>
-- needs nginx".
local function refusing(prefix)
    return setmetatable({}, { __index = function(_, k) return needs_nginx(prefix .. "." .. k) end })
end

local ngx = {
    null = cjson.null,
    OK = 0, ERROR = -1, AGAIN = -2, DONE = -4, DECLINED = -5,
    STDERR = 0, EMERG = 1, ALERT = 2, CRIT = 3, ERR = 4, WARN = 5, NOTICE = 6, INFO = 7, DEBUG = 8,
    HTTP_OK = 200, HTTP_BAD_REQUEST = 400, HTTP_UNAUTHORIZED = 401, HTTP_FORBIDDEN = 403,
    HTTP_NOT_FOUND = 404, HTTP_TOO_MANY_REQUESTS = 429, HTTP_INTERNAL_SERVER_ERROR = 500,
    HTTP_SERVICE_UNAVAILABLE = 503,
    var = {},
    ctx = {},
    header = {},
    config = { subsystem = "http", ngx_lua_version = 10023, nginx_version = 1022001 },
    worker = { id = function() return 0 end, pid = function() return 0 end,
               exiting = function() return false end, count = function() return 1 end },
    req = refusing("ngx.req"),
    socket = refusing("ngx.socket"),
    timer = refusing("ngx.timer"),
    thread = refusing("ngx.thread"),
    sleep = needs_nginx("ngx.sleep"),
    exit = needs_nginx("ngx.exit"),
    exec = needs_nginx("ngx.exec"),
    print = needs_nginx("ngx.print"),
    say = needs_nginx("ngx.say"),
}
function ngx.get_phase()
    return "init"
end

function ngx.log(level, ...)
    local parts = { ... }
    for i = 1, select("#", ...) do
        parts[i] = tostring(parts[i])
    end
    local line = table.concat(parts)
    M.logs[#M.logs + 1] = { level = level, msg = line }
    if os.getenv("RL_UNIT_VERBOSE") == "1" then
        io.stderr:write("[ngx.log ", tostring(level), "] ", line, "\n")
    end
end

-- The clock: cached, as nginx's is, until update_time.
local cached = clock()
function ngx.update_time()
    cached = clock()
end
function ngx.now()
    return cached
end
function ngx.time()
    return math.floor(cached)
end

local MONTHS = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6, Jul = 7, Aug = 8,
                 Sep = 9, Oct = 10, Nov = 11, Dec = 12 }

-- Days since 1970-01-01 of a proleptic Gregorian date.
local function days_from_civil(y, m, d)
    y = m <= 2 and y - 1 or y
    local era = math.floor(y / 400)
    local yoe = y - era * 400
    local doy = math.floor((153 * (m + (m > 2 and -3 or 9)) + 2) / 5) + d - 1
    local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    return era * 146097 + doe - 719468
end

function ngx.http_time(t)
    return os.date("!%a, %d %b %Y %H:%M:%S GMT", t)
end

function ngx.parse_http_time(s)
    local d, mon, y, h, mi, sec = tostring(s):match(
        "^%a%a%a, (%d%d) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
    if not d or not MONTHS[mon] then
        return nil
    end
    return days_from_civil(tonumber(y), MONTHS[mon], tonumber(d)) * 86400
        + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec)
end

local function digest(fn, len)
    return function(s)
        s = tostring(s)
        local out = ffi.new("unsigned char[?]", len)
        fn(s, #s, out)
        return ffi.string(out, len)
    end
end
ngx.md5_bin = digest(crypto.MD5, 16)
ngx.sha1_bin = digest(crypto.SHA1, 20)
function ngx.md5(s)
    return (ngx.md5_bin(s):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local B64_VALUE = {}
for i = 1, #B64 do
    B64_VALUE[B64:byte(i)] = i - 1
end

function ngx.encode_base64(s, no_padding)
    s = tostring(s)
    local out = {}
    for i = 1, #s, 3 do
        local a, b, c = s:byte(i, i + 2)
        local n = bit.bor(bit.lshift(a, 16), bit.lshift(b or 0, 8), c or 0)
        local chunk = {}
        for j = 1, 4 do
            local v = bit.band(bit.rshift(n, (4 - j) * 6), 63)
            chunk[j] = B64:sub(v + 1, v + 1)
        end
        if not b then
            chunk[3], chunk[4] = "=", "="
        elseif not c then
            chunk[4] = "="
        end
        out[#out + 1] = table.concat(chunk)
    end
    local r = table.concat(out)
    return no_padding and (r:gsub("=+$", "")) or r
end

--- nil when `s` is not base64 (padding optional, as in ngx.decode_base64).
function ngx.decode_base64(s)
    if type(s) ~= "string" then
        error("string argument only", 2)
    end
    local body = s:gsub("=+$", "")
    if #s - #body > 2 or #body % 4 == 1 then
        return nil
    end
    local out, n, bits = {}, 0, 0
    for i = 1, #body do
        local v = B64_VALUE[body:byte(i)]
        if not v then
            return nil
        end
        n, bits = bit.bor(bit.lshift(n, 6), v), bits + 6
        if bits >= 8 then
            bits = bits - 8
            out[#out + 1] = string.char(bit.band(bit.rshift(n, bits), 255))
            n = bit.band(n, bit.lshift(1, bits) - 1)
        end
    end
    return table.concat(out)
end

-- A shared dict: key -> { value, flags, expires (process clock) or nil }.
local Dict = {}
Dict.__index = Dict

local function live(self, key)
    local e = self.items[key]
    if e and e.expires and e.expires <= clock() then
        self.items[key] = nil
        return nil
    end
    return e
end

local function expiry(exptime)
    return exptime and exptime > 0 and clock() + exptime or nil
end

local function checked(key)
    if type(key) ~= "string" and type(key) ~= "number" then
        return nil, "bad key"
    end
    return tostring(key)
end

-- The method `fn(self, k, ...)` over the checked form `k` of its key; a
-- bad key answers `refused`, "bad key" (nil for reads, false for writes).
local function keyed(refused, fn)
    return function(self, key, ...)
        local k, err = checked(key)
        if not k then
            return refused, err
        end
        return fn(self, k, ...)
    end
end

Dict.get = keyed(nil, function(self, k)
    local e = live(self, k)
    if not e then
        return nil
    end
    return e.value, e.flags
end)

Dict.set = keyed(false, function(self, k, value, exptime, flags)
    if value == nil then
        self.items[k] = nil
    else
        self.items[k] = { value = value, flags = flags ~= 0 and flags or nil, expires = expiry(exptime) }
    end
    return true, nil, false
end)
Dict.safe_set = Dict.set

Dict.add = keyed(false, function(self, k, value, exptime, flags)
    if live(self, k) then
        return false, "exists", false
    end
    return self:set(k, value, exptime, flags)
end)
Dict.safe_add = Dict.add

function Dict:replace(key, value, exptime, flags)
    local k = checked(key)
    if not k or not live(self, k) then
        return false, "not found", false
    end
    return self:set(k, value, exptime, flags)
end

Dict.incr = keyed(nil, function(self, k, value, init, init_ttl)
    if type(value) ~= "number" then
        error("bad value: a number expected", 2)
    end
    local e = live(self, k)
    if not e then
        if init == nil then
            return nil, "not found"
        end
        self.items[k] = { value = init + value, expires = expiry(init_ttl) }
        return init + value, nil, false
    end
    if type(e.value) ~= "number" then
        return nil, "not a number"
    end
    e.value = e.value + value
    return e.value
end)

function Dict:delete(key)
    self.items[tostring(key)] = nil
    return true
end

function Dict:expire(key, exptime)
    local e = live(self, tostring(key))
    if not e then
        return nil, "not found"
    end
    e.expires = expiry(exptime)
    return true
end

function Dict:ttl(key)
    local e = live(self, tostring(key))
    if not e then
        return nil, "not found"
    end
    return e.expires and math.max(e.expires - clock(), 0) or 0
end

function Dict:get_keys(max)
    max = max or 1024
    local keys = {}
    for k in pairs(self.items) do
        if live(self, k) then
            keys[#keys + 1] = k
            if max > 0 and #keys >= max then
                break
            end
        end
    end
    return keys
end

function Dict:flush_all()
    self.items = {}
end

function Dict:flush_expired()
    local n = 0
    for k, e in pairs(self.items) do
        if e.expires and e.expires <= clock() then
            self.items[k] = nil
            n = n + 1
        end
    end
    return n
end

--- A fresh, empty shared dict (the tests' own ones).
function M.new_dict()
    return setmetatable({ items = {} }, Dict)
end

-- the dicts the library's validation looks for (as the sample declares)
ngx.shared = {}
for _, name in ipairs({ "rl_metrics", "rl_deny", "rl_allowance", "rl_redis", "rl_usage" }) do
    ngx.shared[name] = M.new_dict()
end

-- The Redis driver the library loads (lua-resty-redis, as resty.redis or
-- Debian's nginx.redis): refused, so that no unit test reaches Redis.
local redis_driver = refusing("resty.redis")
redis_driver.add_commands = function() end
package.preload["resty.redis"] = function() return redis_driver end

M.ngx = ngx
_G.ngx = ngx
package.loaded["ngx_stub"] = M
return M
