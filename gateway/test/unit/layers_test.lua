-- The library's layers (ARCHITECTURE.md, "The gateway"): each layer is a
-- folder of lib/resty/rl (the front end's modules sit at its top), and a
-- module requires only modules of its own layer or of the layers below
-- it, with no cycle. A new layer is added here; a module outside every
-- layer's folder, or a require that reaches up, fails this test.

-- Bottom first; "front" is lib/resty/rl itself.
local LAYERS = {
    "base", "observe", "format", "redis", "limit", "request", "policy", "decide", "report", "front",
}

local root = assert(package.searchpath("resty.rl.gateway", package.path)):gsub("gateway%.lua$", "")

-- The .lua files of a folder, by name without the extension.
local function lua_files(dir)
    local names = {}
    local ls = assert(io.popen("ls '" .. dir .. "'"))
    for file in ls:lines() do
        local name = file:match("^([%w_]+)%.lua$")
        if name then
            names[#names + 1] = name
        end
    end
    ls:close()
    return names
end

-- The folders of lib/resty/rl.
local function folders()
    local names = {}
    local ls = assert(io.popen("cd '" .. root .. "' && ls -d */"))
    for dir in ls:lines() do
        names[#names + 1] = dir:match("^([%w_]+)/$")
    end
    ls:close()
    return names
end

-- The modules of the library (full names, "resty.rl.decide.engine"),
-- each with its layer and what it requires of the library.
local function library()
    local modules = {}
    for _, layer in ipairs(LAYERS) do
        local dir = layer == "front" and root or root .. layer .. "/"
        local prefix = layer == "front" and "resty.rl." or "resty.rl." .. layer .. "."
        for _, name in ipairs(lua_files(dir)) do
            local f = assert(io.open(dir .. name .. ".lua"))
            local src = f:read("*a")
            f:close()
            local requires = {}
            for dep in src:gmatch("require%s*%(?%s*[\"'](resty%.rl%.[%w_%.]+)[\"']") do
                if dep ~= prefix .. name then
                    requires[#requires + 1] = dep
                end
            end
            modules[prefix .. name] = { layer = layer, requires = requires }
        end
    end
    return modules
end

local function level_of()
    local level = {}
    for i, layer in ipairs(LAYERS) do
        level[layer] = i
    end
    return level
end

describe("the library's layers", function()
    local modules, level = library(), level_of()

    it("has every folder as a layer and every module in one", function()
        local n = 0
        for _ in pairs(modules) do
            n = n + 1
        end
        assert.is_true(n >= 30)
        for _, dir in ipairs(folders()) do
            assert.is_truthy(level[dir], "lib/resty/rl/" .. dir .. "/ is no layer")
        end
    end)

    it("requires only its own layer or the layers below, and only modules that exist", function()
        local wrong = {}
        for name, m in pairs(modules) do
            for _, dep in ipairs(m.requires) do
                local d = modules[dep]
                if not d then
                    wrong[#wrong + 1] = name .. " requires " .. dep .. ", which is not in the library"
                elseif level[d.layer] > level[m.layer] then
                    wrong[#wrong + 1] = name .. " (" .. m.layer .. ") requires " .. dep .. " (" .. d.layer .. ")"
                end
            end
        end
        table.sort(wrong)
        assert.are.same({}, wrong)
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
            for _, dep in ipairs(modules[name] and modules[name].requires or {}) do
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
