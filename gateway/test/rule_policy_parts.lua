-- Parts of the rule policies of the end-to-end tests (test/rules.lua,
-- test/distinct.lua).
local M = {}

--- The tests' Redis: RL_REDIS_PORT on loopback, as in the shipped examples.
M.redis = { host = "127.0.0.1", port = tonumber(os.getenv("RL_REDIS_PORT") or "6379"),
            timeout_ms = 1000 }

--- An identity of `n` required API keys of tenant `tenant`: the key
--- "<prefix>-<i>" has the key id "<prefix><i>" (i from 1 to n).
function M.api_keys(prefix, n, tenant)
    local keys = {}
    for i = 1, n do
        keys[prefix .. "-" .. i] = { key_id = prefix .. i, tenant = tenant }
    end
    return { required = true, api_key = { keys = keys } }
end

return M
