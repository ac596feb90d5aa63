-- resty.rl.base.tables: helpers over plain Lua tables shared by the modules
-- that build a configuration, a caller's limiter or a body from a template.

local _M = {}

--- A copy of `t` with each value `v` replaced by `f(v, x)` (the keys
--- kept; a value f maps to nil is left out).
function _M.mapped(t, f, x)
    local out = {}
    for k, v in pairs(t) do
        out[k] = f(v, x)
    end
    return out
end

return _M
