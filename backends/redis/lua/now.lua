-- First in every dedup-redis script (see src/scripts.rs): "now" and number formatting.

-- "now" in ms: the injected clock's value when the caller passed one, else the server's TIME
-- (allowed before writes: Redis 7 replicates scripts by their effects).
local function now_ms(arg)
    if arg ~= '' then
        return tonumber(arg)
    end
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
    return string.format('%d', n)
end
