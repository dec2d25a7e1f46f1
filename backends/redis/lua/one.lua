-- One call of `op` (lua/claim.lua or lua/commit.lua) on KEYS[1].
-- ARGV: now ('' = server TIME), retention ms, then op's three arguments.
-- Reply: op's reply.
return op(KEYS[1], now_ms(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5])
