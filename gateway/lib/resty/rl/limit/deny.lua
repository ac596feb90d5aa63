-- resty.rl.limit.deny: the edge deny cache of a rule policy (and of the tier
-- form's API key bucket). A key found boxed in Redis is remembered in a
-- lua_shared_dict (deny_cache.dict, shared by the workers of one nginx
-- node) until its box ends, so that its next requests are answered here
-- without a Redis round trip (a manual box: for deny_cache.manual_ttl
-- seconds at a time).
--
-- A release reaches the node in two ways:
--   * every cached box is trusted for deny_cache.recheck seconds after
--     Redis last said so; past that it is stale, and the next request
--     of its key goes to Redis (which says whether the box is still
--     there, refreshing the entry, or gone, dropping it). So a release
--     by any client (`RL.BOX RELEASE <key>`, or a box that a trip
--     replaced) is seen within `recheck` seconds and one round trip;
--   * every worker polls the release version `<prefix>:deny:version`
--     (one GET every deny_cache.poll seconds) and, when it changed,
--     drops the cached boxes of that prefix at once (`rlctl release`
--     increments it).
-- (gateway/README.md, "The edge deny cache, and how to release a box".)
--
-- When several keys of one request are boxed, the cache answers with the
-- strictest box (resty.rl.limit.deny.stricter). The same dict keeps the alert
-- de-duplication marks (one alert per box).

local cjson = require "cjson.safe"
local commands = require "resty.rl.redis.commands"
local limiters = require "resty.rl.limit.limiters"
local hotpath = require "resty.rl.base.hotpath"

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

--- A cached box of `key`: {level, retry_ms (nil: manual), stale (true
--- once Redis last confirmed it deny_cache.recheck seconds ago or more:
--- ask Redis again)}, or nil.
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
    ngx.update_time()
    local now = ngx.now() * 1000
    local stale = now - (box.checked or 0) >= conf.deny_cache.recheck * 1000
    if box.ends < 0 then
        return { level = box.level, retry_ms = nil, stale = stale }
    end
    local left = box.ends - now
    if left <= 0 then
        return nil
    end
    return { level = box.level, retry_ms = math.ceil(left), stale = stale }
end

--- Remembers that `key` is boxed at `level` for `retry_ms` more (nil: a
--- manual box), as Redis said just now.
function _M.put(conf, key, level, retry_ms)
    local d = dict(conf)
    if not d then
        return
    end
    ngx.update_time()
    local now = ngx.now() * 1000
    local ends, ttl = -1, conf.deny_cache.manual_ttl
    if retry_ms then
        ends = now + retry_ms
        ttl = retry_ms / 1000
    end
    d:set(key, cjson.encode({ level = level, ends = ends, checked = now }), ttl)
end

--- Forgets the cached box of `key` (Redis no longer has it).
function _M.forget(conf, key)
    local d = dict(conf)
    if d then
        d:delete(key)
    end
end

--- Is box `a` stricter than box `b` (each {level, retry_ms}, retry_ms nil
--- for a manual box)? The higher level, then the later end (a manual box
--- has none: it ends last).
function _M.stricter(a, b)
    local la, lb = a.level or 0, b.level or 0
    if la ~= lb then
        return la > lb
    end
    return (a.retry_ms or math.huge) > (b.retry_ms or math.huge)
end

-- Entry `e` with its outcome set to the cached `box`.
local function answer_with(e, box)
    e.outcome = { state = "boxed", retry_ms = box.retry_ms, level = box.level,
                  strikes = 0, cached = true,
                  binding = { name = e.name, limit = limiters.capacity(e), remaining = 0,
                              boxed = true } }
    return e
end

-- Entry `e` of a rule policy's request with its outcome set when its key
-- is cached as boxed (fresh), else nil. A cached box, fresh or stale, is
-- kept as e.known_box; a stale one marks the request (state.deny_stale).
local function cached_box(conf, e, state)
    local box = limiters.boxes(e) and _M.get(conf, e.key)
    if not box then
        return nil
    end
    e.known_box = box
    if box.stale then
        state.deny_stale = true
        return nil
    end
    return answer_with(e, box)
end

--- The entry of `entries` (a rule policy's request, resty.rl.decide.engine)
--- whose key has the strictest box this node knows (_M.stricter), its
--- outcome set (boxed, `cached`); nil when none is cached, or when a
--- cached box of theirs is stale (state.deny_stale set): Redis then
--- answers for all of them, so that a cached box never hides a stricter
--- one.
function _M.strictest_entry(conf, entries, state)
    local one = hotpath.single(entries)
    if one then
        -- one entry, without a loop (resty.rl.base.hotpath)
        return cached_box(conf, one, state)
    end
    local best
    for _, e in ipairs(entries) do
        if cached_box(conf, e, state) and (not best or _M.stricter(e.outcome, best.outcome)) then
            best = e
        end
    end
    if state.deny_stale then
        for _, e in ipairs(entries) do
            if e.outcome and e.outcome.cached then
                e.outcome = false
            end
        end
        return nil
    end
    return best
end

--- Redis failed after a stale cached box sent the request there: the
--- entry of `entries` with the strictest box cached for them, stale ones
--- included (the best knowledge without Redis: a known box is not let
--- through while Redis is away), its outcome set; or nil.
function _M.strictest_known(entries)
    local best
    for _, e in ipairs(entries) do
        if e.known_box then
            answer_with(e, e.known_box)
            if not best or _M.stricter(e.outcome, best.outcome) then
                best = e
            end
        end
    end
    return best
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
    local res = commands.pipeline(conf, { { "GET", _M.version_key(conf) } })
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
