-- A purge step on one node (the server, or one cluster primary): purge the keys an earlier
-- step found and left, then, while there is room and time, go on with `SCAN` from the
-- cursor and purge what it finds, all in this one call. Keys never travel to the client
-- and back unless the step runs out of room or time.
--
-- No KEYS: every key comes from `SCAN` on this node. In a cluster they span many slots,
-- which a script without flags may touch as long as this node owns them; a key whose slot
-- moved away since it was found is handed back, for the client to purge through the slot's
-- new owner.
--
-- The step stops taking keys once it has held the server `budget` microseconds (read every
-- few keys, with lua/now.lua's stopwatch: TIME, and the CPU time where TIME stands still
-- inside a script, as on Valkey), so a live claim queued behind it waits that long at most.
--
-- ARGV: now ('' = server TIME), purge retention ms, room (records it may still remove),
-- budget (µs), cursor ('' = do not scan), pattern, count, then the keys found earlier.
-- Reply: { next cursor ('' when it did not scan: out of room or time first, or given no
-- cursor; never the cursor given, which could be 0, what SCAN answers at the end of a walk),
-- completed, expired,
-- keys left (not looked at), keys elsewhere (owned by another node), µs held }.
local started = stopwatch()
local now = now_ms(ARGV[1])
local retention = tonumber(ARGV[2])
local room = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local completed, expired = 0, 0
local left, elsewhere = {}, {}
-- Keys between two reads of the clock (a read costs about a fifth of a key's purge).
local CHECK_EVERY = 8

local function over()
    return room <= 0 or elapsed_us(started) >= budget
end

local function purge_all(keys, first)
    for i = first, #keys do
        if room <= 0 or ((i - first) % CHECK_EVERY == 0 and over()) then
            for j = i, #keys do
                left[#left + 1] = keys[j]
            end
            return
        end
        local ok, tag = pcall(op, keys[i], now, retention)
        if ok then
            if tag == 'c' then
                completed = completed + 1
                room = room - 1
            elseif tag == 'e' then
                expired = expired + 1
                room = room - 1
            end
        else
            local message = type(tag) == 'table' and tag.err or tostring(tag)
            if not string.find(message, 'non local key', 1, true) then
                error(tag)
            end
            elsewhere[#elsewhere + 1] = keys[i]
        end
    end
end

purge_all(ARGV, 8)
local cursor = ''
if ARGV[5] ~= '' and #left == 0 and not over() then
    local step = redis.call('SCAN', ARGV[5], 'MATCH', ARGV[6], 'COUNT', ARGV[7])
    cursor = step[1]
    purge_all(step[2], 1)
end
return { cursor, completed, expired, left, elsewhere, elapsed_us(started) }
