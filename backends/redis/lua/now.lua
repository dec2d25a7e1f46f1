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

-- Microseconds of server time since `started` (a `TIME` reply), as an integer reply; 0 if
-- the server's clock stepped back meanwhile.
local function elapsed_us(started)
    local t = redis.call('TIME')
    local us = (tonumber(t[1]) - tonumber(started[1])) * 1000000
        + tonumber(t[2]) - tonumber(started[2])
    return math.max(0, us)
end
