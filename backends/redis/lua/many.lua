-- A batch: `op` (lua/claim.lua, lua/commit.lua or lua/purge.lua) on each of KEYS in order, all at one
-- "now" (one TIME for the batch). Each call sees what the earlier ones wrote, so a key
-- repeated in the batch behaves as the single calls made one after another.
-- ARGV: now ('' = server TIME), retention ms, then op's three arguments per key, in order.
-- Reply: one op reply per key, in order.
local now = now_ms(ARGV[1])
local retention = tonumber(ARGV[2])
local replies = {}
for i, key in ipairs(KEYS) do
    local a = 3 * i
    replies[i] = op(key, now, retention, ARGV[a], ARGV[a + 1], ARGV[a + 2])
end
return replies
