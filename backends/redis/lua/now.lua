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

-- A stopwatch of the time a script holds the server, for elapsed_us: the server's TIME and,
-- where the sandbox has `os.clock` (Valkey, Redis >= 8; not Redis 7), the server process's
-- CPU time. Valkey answers TIME inside a script with the time the script started (it stays
-- the same all through the script), so there only the CPU time measures the script's work.
local function stopwatch()
    local os_lib = rawget(_G, 'os')
    local cpu = os_lib and os_lib.clock
    return { time = redis.call('TIME'), cpu = cpu, cpu_at = cpu and cpu() }
end

-- Microseconds the server has been held since `started` (a stopwatch), as an integer reply:
-- the larger of the TIME and CPU readings (0 if the server's clock stepped back meanwhile).
local function elapsed_us(started)
    local t = redis.call('TIME')
    local us = (tonumber(t[1]) - tonumber(started.time[1])) * 1000000
        + tonumber(t[2]) - tonumber(started.time[2])
    if started.cpu then
        us = math.max(us, math.floor((started.cpu() - started.cpu_at) * 1000000))
    end
    return math.max(0, us)
end
