-- A purge batch: `op` (lua/purge.lua) on each of KEYS in order, all at one "now", and the
-- server time the call took. ARGV: now ('' = server TIME), purge retention ms.
-- Reply: one op reply per key, in order, then the microseconds from the call's first
-- `TIME` to its last: how long this call held the server, which the purge paces itself on
-- (its round trips' wall time also counts the wait behind other clients).
local started = redis.call('TIME')
local now = now_ms(ARGV[1])
local retention = tonumber(ARGV[2])
local replies = {}
for i, key in ipairs(KEYS) do
    replies[i] = op(key, now, retention)
end
replies[#KEYS + 1] = elapsed_us(started)
return replies
