-- The library's layers (ARCHITECTURE.md, "The gateway"): every module of
-- lib/resty/rl belongs to exactly one layer, and requires only modules of
-- its own layer or of the layers below it, with no cycle. A new module
-- is added here; a require that reaches up fails this test.

-- Bottom first.
local LAYERS = {
    { "base", { "hotpath", "memo", "tables" } },
    { "observe", { "metrics", "usage_counts" } },
    { "format", { "headers", "problem" } },
    { "redis", { "connection", "cluster", "redis", "commands", "redis_env" } },
    { "limit", { "limiters", "distinct", "allowance", "settle", "fallback", "deny", "quota_alerts" } },
    { "request", { "request", "identity", "jws" } },
    { "policy", { "refs", "rules", "tier_form", "config" } },
    { "decide", { "matching", "phases", "answer", "log_phase", "engine" } },
    { "report", { "usage" } },
    { "front", { "gateway", "nginx" } },
}

local dir = assert(package.searchpath("resty.rl.engine", package.path)):gsub("engine%.lua$", "")

-- The modules of the library (the .lua files of its folder) and what
-- each requires of it.
local function library()
    local modules = {}
    local ls = assert(io.popen("ls '" .. dir .. "'"))
    for file in ls:lines() do
        local name = file:match("^([%w_]+)%.lua$")
        if name then
            local f = assert(io.open(dir .. file))
            local src = f:read("*a")
            f:close()
            local requires = {}
            for dep in src:gmatch("require%s*%(?%s*[\"']resty%.rl%.([%w_]+)[\"']") do
                if dep ~= name then
                    requires[#requires + 1] = dep
                end
            end
            modules[name] = requires
        end
    end
    ls:close()
    return modules
end

local function level_of()
    local level = {}
    for i, layer in ipairs(LAYERS) do
        for _, m in ipairs(layer[2]) do
            assert(not level[m], m .. " is in two layers")
            level[m] = i
        end
    end
    return level
end

describe("the library's layers", function()
    local modules, level = library(), level_of()

    it("has every module in one layer, and no layer names a module that is gone", function()
        local n = 0
        for name in pairs(modules) do
            n = n + 1
            assert.is_truthy(level[name], name .. ".lua is in no layer")
        end
        for name in pairs(level) do
            assert.is_truthy(modules[name], name .. " is in a layer but not in the library")
        end
        assert.is_true(n >= 30)
    end)

    it("requires only its own layer or the layers below", function()
        local up = {}
        for name, requires in pairs(modules) do
            for _, dep in ipairs(requires) do
                if level[dep] and level[dep] > level[name] then
                    up[#up + 1] = name .. " (" .. LAYERS[level[name]][1] .. ") requires " .. dep
                        .. " (" .. LAYERS[level[dep]][1] .. ")"
                end
            end
        end
        table.sort(up)
        assert.are.same({}, up)
    end)

    it("has no require cycle", function()
        local state, cycle = {}, nil
        local function visit(name, path)
            if state[name] == "done" or cycle then
                return
            end
            if state[name] == "open" then
                cycle = table.concat(path, " -> ") .. " -> " .. name
                return
            end
            state[name] = "open"
            path[#path + 1] = name
            for _, dep in ipairs(modules[name] or {}) do
                visit(dep, path)
            end
            path[#path] = nil
            state[name] = "done"
        end
        for name in pairs(modules) do
            visit(name, {})
        end
        assert.is_nil(cycle)
    end)
end)
