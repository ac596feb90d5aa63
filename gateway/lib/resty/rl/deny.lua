-- resty.rl.deny: the edge deny cache of a rule policy. A key found boxed
-- in Redis is remembered in a lua_shared_dict (deny_cache.dict, shared by
-- the workers of one nginx node) until its box ends, so that its next
-- requests are answered here without a Redis round trip (a manual box: for
-- deny_cache.manual_ttl seconds at a time). A release is seen within
-- deny_cache.poll seconds: every worker polls the release version
-- `<prefix>:deny:version` (one GET a second) and, when it changed, drops
-- the cached boxes of that prefix. Release a box with
--   RL.BOX RELEASE <key>   then   INCR <prefix>:deny:version
-- (gateway/README.md, "Releasing a box").
--
-- The same dict keeps the alert de-duplication marks (one alert per box).

local cjson = require "cjson.safe"
local store = require "resty.rl.store"

local _M = {}

-- The release version this node saw last, per key prefix: gateways with
-- different prefixes may share a dict, a release drops the boxes of its
-- own prefix only.
local VERSION_MARK = "\1version:"

local pollers = setmetatable({}, { __mode = "k" })

local function dict(conf)
    return ngx.shared[conf.deny_cache.dict]
end

--- The release version key of a policy.
function _M.version_key(conf)
    return conf.key_prefix .. ":deny:version"
end

--- A cached box of `key`: {level, retry_ms (nil: manual)} or nil.
function _M.get(conf, key)
    local d = dict(conf)
    local v = d and d:get(key)
    if not v then
        return nil
    end
    local box = cjson.decode(v)
    if type(box) ~= "table" then
        return nil
    end
    if box.ends < 0 then
        return { level = box.level, retry_ms = nil }
    end
    ngx.update_time()
    local left = box.ends - ngx.now() * 1000
    if left <= 0 then
        return nil
    end
    return { level = box.level, retry_ms = math.ceil(left) }
end

--- Remembers that `key` is boxed at `level` for `retry_ms` more (nil: a
--- manual box).
function _M.put(conf, key, level, retry_ms)
    local d = dict(conf)
    if not d then
        return
    end
    ngx.update_time()
    local ends, ttl = -1, conf.deny_cache.manual_ttl
    if retry_ms then
        ends = ngx.now() * 1000 + retry_ms
        ttl = retry_ms / 1000
    end
    d:set(key, cjson.encode({ level = level, ends = ends }), ttl)
end

--- True once per node for a mark (`name`, kept `ttl` seconds): the alert
--- of one box is sent once.
function _M.once(conf, name, ttl)
    local d = dict(conf)
    if not d then
        return true
    end
    return d:add("\1alert:" .. name, true, ttl) == true
end

local function poll(premature, conf)
    if premature then
        return
    end
    local d = dict(conf)
    local res = store.pipeline(conf, { { "GET", _M.version_key(conf) } })
    if not d or not res then
        return
    end
    local v = res[1]
    v = type(v) == "string" and v or "0"
    local mark = VERSION_MARK .. conf.key_prefix
    local seen = d:get(mark)
    if seen ~= v then
        -- also without a version seen yet: boxes cached before this
        -- worker's first poll may predate a release
        local own = conf.key_prefix .. ":"
        for _, k in ipairs(d:get_keys(0)) do
            if k:sub(1, #own) == own then
                d:delete(k)
            end
        end
        d:set(mark, v)
    end
end

--- Starts this worker's release poller for `conf` (once).
function _M.ensure_poller(conf)
    if pollers[conf] or not dict(conf) then
        return
    end
    pollers[conf] = true
    -- a first poll at once, then every `poll` seconds
    ngx.timer.at(0, poll, conf)
    local ok, err = ngx.timer.every(conf.deny_cache.poll, poll, conf)
    if not ok then
        pollers[conf] = nil
        ngx.log(ngx.WARN, "rl: cannot start the deny cache poller: ", err)
    end
end

return _M
