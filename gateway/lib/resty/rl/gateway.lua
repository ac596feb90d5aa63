-- resty.rl.gateway: the request policy, independent of the front end.
--
-- A front end (resty.rl.nginx, the Kong plugin) creates one gateway per
-- configuration with new(conf) and calls, per request:
--   gw:access(req)         access phase: decide; refuse, or let through
--   gw:header_filter(req)  header filter: add the rate-limit fields
--   gw:body_filter(req)    body filter: post-paid rules read the usage
--   gw:log(req)            log phase: count, log, release leases, record
--                          failures (in a timer: no cosockets here)
-- `req` is the front end's adapter, a table of functions:
--   header(name), header_values(name) (every value of a header: a string,
--   a list for a repeated one, or nil), method(), path(), query_arg(name)
--   and body_arg(name)
--   (raw values of the query string and of a form or JSON body; a list for
--   a repeated argument; body_arg gives nil, "too_large" for a body the
--   front end cannot read), client_ip(), request_id(),
--   ctx() (per-request table), exit(status, body, headers),
--   set_header(name, value), set_upstream_header(name, value),
--   bytes_sent(), status() (response status, log phase), warn(message).
--
-- The per-request state lives in ctx() (ngx.ctx, kong.ctx.plugin). An
-- internal redirect (error_page, ngx.exec, try_files to a named location)
-- clears ngx.ctx: the log phase then finds no state, and the leases of the
-- request are only given back by their ttl. Keep such redirects off the
-- locations that run the gateway (see gateway/README.md).
--
-- Both configuration forms run on one engine: a tier-form configuration
-- is translated into a rule policy when it is built (resty.rl.policy.config,
-- resty.rl.policy.tier_form), and resty.rl.decide.engine decides every request.

-- Everything the library may need is loaded with these, with the front
-- end (in init_by_lua, by nginx's master): the workers run as another
-- user, who may not read the library's directory (a checkout in root's
-- home). No module requires another inside a function.
local config = require "resty.rl.policy.config"
local engine = require "resty.rl.decide.engine"

local _M = {}

--- A gateway for `user_conf` (a partial configuration over the defaults
--- of resty.rl.policy.config). Raises an error on an invalid configuration.
function _M.new(user_conf)
    return engine.new(config.build(user_conf))
end

return _M
