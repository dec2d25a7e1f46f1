-- One `SCAN cursor MATCH pattern COUNT count` step, timed like lua/purge_many.lua.
-- No KEYS (it reads none by name); ARGV: cursor, pattern, count.
-- Reply: { next cursor, keys found, microseconds the step held the server }.
local started = redis.call('TIME')
local step = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
return { step[1], step[2], elapsed_us(started) }
