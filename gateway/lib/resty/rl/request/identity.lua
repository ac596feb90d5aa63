-- resty.rl.request.identity: who is calling, for a rule policy. Attributes
-- (key_id, tenant, tier, brand, user, ip, subject, header:<name>,
-- arg:<name>, claim:<name>) come from:
--   * the API key (identity.api_key): the policy's static table and/or
--     the identity store in Redis, cached per worker for cache_ttl seconds,
--     so that a tier change, an override or a revoked key takes effect
--     within seconds without a reload;
--   * the claims of a JWT verified here (identity.jwt: HS256 here, RS256
--     and ES256 by resty.rl.request.jws);
--   * headers an authentication layer in front has set (identity.headers);
--   * the client address, behind trusted proxies only (trusted_proxies);
--   * a request header, a query or body argument, the login subject.
--
-- Identity store keys (documented in gateway/REFERENCE.md):
--   <prefix>:id:key:<sha1 hex of the API key>  hash: key_id tenant tier brand revoked
--   <prefix>:id:tenant:<tenant>                hash: tier, and tier field overrides
--   <prefix>:id:brand:<brand>                  hash: brand overrides (deposit_total_24h, ...)

local fallback = require "resty.rl.limit.fallback"
local cjson = require "cjson.safe"
local commands = require "resty.rl.redis.commands"
local connection = require "resty.rl.redis.connection"
local request = require "resty.rl.request.fields"
local jws = require "resty.rl.request.jws"
local hotpath = require "resty.rl.base.hotpath"
local memo = require "resty.rl.base.memo"
local new_table = hotpath.new_table

local _M = {}

local caches = setmetatable({}, { __mode = "k" })

local function cache_for(conf)
    return fallback.lru_for(caches, conf)
end

local function hex(s)
    return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

--- The identity store key of an API key (its SHA-1, never the key).
function _M.key_record(conf, api_key)
    return conf.key_prefix .. ":id:key:" .. hex(ngx.sha1_bin(api_key))
end

-- A flat HGETALL reply as a table, or nil when empty.
local function hash(reply)
    if type(reply) ~= "table" or #reply == 0 or reply[1] == false then
        return nil
    end
    return connection.flat_map(reply)
end

-- Reads (cached) store hashes named by `names` ({cache key = redis key}).
-- Returns {cache key = table or false} or nil and an error.
local function read_hashes(conf, names)
    local cache, out, cmds, order, stale = cache_for(conf), {}, {}, {}, {}
    for ck, rk in pairs(names) do
        local v, old = cache:get(ck)
        if v ~= nil then
            out[ck] = v
        else
            cmds[#cmds + 1] = { "HGETALL", rk }
            order[#order + 1] = ck
            stale[ck] = old
        end
    end
    if #cmds == 0 then
        return out
    end
    local res, err = commands.pipeline(conf, cmds)
    if not res then
        -- the store is away: what this worker knew last, when it knew it
        for _, ck in ipairs(order) do
            if stale[ck] == nil then
                return nil, err
            end
            out[ck] = stale[ck]
        end
        return out
    end
    for i, ck in ipairs(order) do
        local v = hash(res[i]) or false
        out[ck] = v
        cache:set(ck, v, conf.identity.cache_ttl)
    end
    return out
end

-- The API key's record: the static table first, then the store.
local function api_key_entry(conf, key)
    local ak = conf.identity.api_key
    local e = ak.keys[key]
    if e or not conf.identity.store then
        return e or false
    end
    local ck = "key:" .. ngx.md5(key)
    local got, err = read_hashes(conf, { [ck] = _M.key_record(conf, key) })
    if not got then
        return nil, err
    end
    return got[ck]
end

-- base64url without padding, as JWTs carry it.
local function b64url(s)
    s = s:gsub("-", "+"):gsub("_", "/")
    local pad = #s % 4
    if pad > 0 then
        s = s .. string.rep("=", 4 - pad)
    end
    return ngx.decode_base64(s)
end

local hmac_sha256
do
    local ok, ffi = pcall(require, "ffi")
    if ok then
        pcall(ffi.cdef, [[
            typedef struct evp_md_st EVP_MD;
            const EVP_MD *EVP_sha256(void);
            unsigned char *HMAC(const EVP_MD *evp_md, const void *key, int key_len,
                                const unsigned char *d, size_t n, unsigned char *md,
                                unsigned int *md_len);
        ]])
        -- OpenSSL's HMAC, linked into nginx (and Kong)
        hmac_sha256 = function(key, data)
            local md = ffi.new("unsigned char[32]")
            local len = ffi.new("unsigned int[1]")
            if ffi.C.HMAC(ffi.C.EVP_sha256(), key, #key, data, #data, md, len) == nil then
                return nil
            end
            return ffi.string(md, len[0])
        end
    end
end

-- Compares two strings in time independent of where they differ.
local function same(a, b)
    if #a ~= #b then
        return false
    end
    local diff = 0
    for i = 1, #a do
        diff = bit.bor(diff, bit.bxor(a:byte(i), b:byte(i)))
    end
    return diff == 0
end

-- An HS256 secret_env that the worker does not have (not exported before
-- nginx started, or no `env` line: nginx clears the environment) refuses
-- every token with 401; say why in the error log, once per worker and name.
local warned_env = {}
local function missing_secret(name)
    if not warned_env[name] then
        warned_env[name] = true
        ngx.log(ngx.ERR, "rl: identity.jwt: the environment variable ", name,
            " is not set in this worker, every token is refused (401): export it",
            " before nginx starts and declare it with `env ", name, ";`")
    end
end

--- The claims of the request's JWT (Authorization: Bearer, or the
--- configured header), verified: the signature of the configured `alg`
--- (HS256 with the secret; RS256 or ES256 with the public key that
--- resty.rl.policy.rules loaded as `jconf.key`), `exp` and `nbf`. Returns nil
--- for a missing or bad token, or one whose header names another alg.
function _M.jwt_claims(jconf, req)
    local h = request.header(req, jconf.header or "Authorization")
    local token = h and (h:match("^%s*[Bb]earer%s+(%S+)%s*$") or (jconf.header and h))
    local alg = jconf.alg or "HS256"
    if not token or alg == "HS256" and not hmac_sha256 then
        return nil
    end
    local h64, p64, s64 = token:match("^([%w_%-]+)%.([%w_%-]+)%.([%w_%-]+)$")
    if not h64 then
        return nil
    end
    local head = cjson.decode(b64url(h64) or "")
    if type(head) ~= "table" or head.alg ~= alg then
        return nil
    end
    local sig = b64url(s64)
    if not sig then
        return nil
    end
    if alg == "HS256" then
        local secret = jconf.secret or os.getenv(jconf.secret_env)
        if not secret then
            missing_secret(jconf.secret_env)
        end
        local want = secret and hmac_sha256(secret, h64 .. "." .. p64)
        if not want or not same(sig, want) then
            return nil
        end
    elseif not jws.verify(alg, jconf.key, h64 .. "." .. p64, sig) then
        return nil
    end
    local claims = cjson.decode(b64url(p64) or "")
    if type(claims) ~= "table" then
        return nil
    end
    local now = ngx.time()
    local leeway = jconf.leeway or 30
    if type(claims.exp) == "number" and now > claims.exp + leeway then
        return nil
    end
    if type(claims.nbf) == "number" and now + leeway < claims.nbf then
        return nil
    end
    return claims
end

-- IPv4 dotted quad to a number, or nil.
local function ipv4(s)
    local a, b, c, d = s:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
    if not a then
        return nil
    end
    a, b, c, d = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
    if a > 255 or b > 255 or c > 255 or d > 255 then
        return nil
    end
    return ((a * 256 + b) * 256 + c) * 256 + d
end

--- Compiles trusted proxies ("10.0.0.0/8", "127.0.0.1", an IPv6 address
--- compared as written) to a predicate on an address.
function _M.trust(list)
    local nets, exact = {}, {}
    for _, p in ipairs(list or {}) do
        if p == "*" then
            -- every address (the tier form's client_ip_header)
            return function()
                return true
            end
        end
        local addr, bits = p:match("^([^/]+)/(%d+)$")
        local n = ipv4(addr or p)
        if n then
            bits = tonumber(bits or 32)
            local size = 2 ^ (32 - bits)
            nets[#nets + 1] = { math.floor(n / size) * size, size }
        else
            exact[p] = true
        end
    end
    return function(ip)
        if exact[ip] then
            return true
        end
        local n = ip and ipv4(ip)
        if not n then
            return false
        end
        for _, net in ipairs(nets) do
            if n >= net[1] and n < net[1] + net[2] then
                return true
            end
        end
        return false
    end
end

--- The client's address: the connection's, or, when it comes from a
--- trusted proxy, the right-most address of X-Forwarded-For (the
--- client_ip_header) that is not a trusted proxy. Without trusted_proxies
--- the header is never read.
function _M.client_ip(conf, req)
    local remote = req.client_ip()
    if not conf.trusted then
        return remote
    end
    if not conf.trusted(remote) then
        return remote
    end
    local h = req.header(conf.client_ip_header)
    if type(h) == "table" then
        h = table.concat(h, ",")
    end
    local hops = {}
    for a in (h or ""):gmatch("[^,%s]+") do
        hops[#hops + 1] = a
    end
    for i = #hops, 1, -1 do
        if not conf.trusted(hops[i]) then
            return hops[i]
        end
    end
    return hops[1] or remote
end

-- The overrides and tier data of a caller without any (shared: read only).
local NONE = hotpath.shared_empty("identity table")

-- The attributes of a caller whose API key has the record `e` (nil: no
-- key): those of the record (key_id, tenant, tier, brand, user), made
-- by one constructor without a loop (a loop run once per request keeps
-- LuaJIT from compiling the access phase: see resty.rl.base.hotpath), with
-- room for the attributes read later (tier, ip, ...).
local function key_attrs(e)
    if not e then
        return new_table(0, 4)
    end
    return { key_id = e.key_id, tenant = e.tenant, tier = e.tier, brand = e.brand,
             user = e.user, ip = nil, route = nil, subject = nil }
end

-- The caller's tier (the default one when it has none the policy knows)
-- and its data.
local function with_tier(conf, ident)
    local attrs = ident.attrs
    if attrs.tier == nil or not conf.tiers[attrs.tier] then
        attrs.tier = conf.default_tier
    end
    ident.tier_data = attrs.tier and conf.tiers[attrs.tier] or NONE
    return ident
end

-- The callers of the API keys of a policy's own table when nothing else
-- tells who calls (no identity store, JWT or identity headers), by
-- configuration and key record: one per key, shared by its requests
-- (`shared`: _M.attr keeps nothing in it).
local static_callers = memo.new(10000, true)
local function static_caller(conf, record)
    return with_tier(conf, { attrs = key_attrs(record), overrides = NONE, tier_data = NONE,
                             record = record, authenticated = true, refused = false,
                             claims = false, shared = true })
end

--- The caller of a request: {attrs, tier_data, overrides, record (the API
--- key's, or false), authenticated, refused (why the API key is refused:
--- "revoked", "unknown", "ambiguous" when its header came more than once;
--- false), claims (false without a JWT), shared (true: the caller of
--- every request of its API key, never written)}, or nil and an error
--- when the identity store failed.
function _M.resolve(conf, req)
    local id = conf.identity
    -- the key's record, or why the key is refused ("revoked", "unknown")
    local record, refused
    local key, ambiguous = request.credential(req, id.api_key.header)
    if ambiguous then
        refused = "ambiguous"
    elseif key then
        local e, err = api_key_entry(conf, key)
        if e == nil then
            return nil, err
        end
        if e and e.revoked ~= "1" and e.revoked ~= true then
            record = e
        else
            refused = e and "revoked" or "unknown"
        end
    end
    if record and not (id.store or id.jwt or id.headers) then
        return static_callers:peek(conf, record) or static_callers:get(conf, record, static_caller)
    end
    local attrs = key_attrs(record)
    -- one constructor with every field, at most 8 (see resty.rl.decide.phases.start)
    local ident = { attrs = attrs, overrides = NONE, tier_data = NONE, record = record or false,
                    authenticated = record ~= nil, refused = refused or false, claims = false,
                    shared = false }
    if id.jwt then
        local claims = _M.jwt_claims(id.jwt, req)
        if claims then
            ident.claims, ident.authenticated = claims, true
            for attr, claim in pairs(id.jwt.claims) do
                local v = claims[claim]
                if attrs[attr] == nil and type(v) == "string" then
                    attrs[attr] = v
                elseif attrs[attr] == nil and type(v) == "number" then
                    attrs[attr] = request.number_text(v)
                end
            end
        end
    end
    if id.headers then
        for attr, hname in pairs(id.headers) do
            local v = request.header(req, hname)
            if v and attrs[attr] == nil then
                attrs[attr] = v
                ident.authenticated = true
            end
        end
    end
    -- the store's tenant and brand records: a tier change and overrides
    if id.store and (attrs.tenant or attrs.brand) then
        ident.overrides = {}
        local names = {}
        if attrs.tenant then
            names["tenant:" .. attrs.tenant] = conf.key_prefix .. ":id:tenant:" .. attrs.tenant
        end
        if attrs.brand then
            names["brand:" .. attrs.brand] = conf.key_prefix .. ":id:brand:" .. attrs.brand
        end
        -- without them (the store away, nothing cached) the tier's own values apply
        local got = read_hashes(conf, names) or {}
        ident.overrides.tenant = attrs.tenant and got["tenant:" .. attrs.tenant] or nil
        ident.overrides.brand = attrs.brand and got["brand:" .. attrs.brand] or nil
        if ident.overrides.tenant and ident.overrides.tenant.tier
            and conf.tiers[ident.overrides.tenant.tier] then
            attrs.tier = ident.overrides.tenant.tier
        end
    end
    return with_tier(conf, ident)
end

--- The value of attribute `name` for a request (nil when it has none),
--- or nil, "ambiguous" for an argument with two different values (or
--- "too_large": in a body too large for the gateway to read).
function _M.attr(conf, req, ident, name, route)
    local v = ident.attrs[name]
    if v ~= nil then
        return v
    end
    if name == "ip" then
        v = _M.client_ip(conf, req)
    elseif name == "route" then
        v = route.name
    elseif name == "subject" then
        local err
        v, err = request.auth_subject(req, conf.subject_arg or "client_id")
        if err then
            return nil, err
        end
    else
        local kind, rest = name:match("^(%a+):(.+)$")
        if kind == "header" then
            v = request.header(req, rest)
        elseif kind == "arg" then
            local err
            v, err = request.arg(req, rest)
            if err then
                return nil, err
            end
        elseif kind == "claim" then
            v = ident.claims and ident.claims[rest]
            v = type(v) == "number" and request.number_text(v)
                or type(v) == "string" and v or nil
        end
    end
    if not ident.shared then
        ident.attrs[name] = v
    end
    return v
end

return _M
