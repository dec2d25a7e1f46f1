-- purge_run: keep the store's last purge run in KEYS[1], a hash, replacing the one before,
-- finished at "now".
-- ARGV: now ('' = server TIME), records removed, ms it took, stopped early ('1' or '0').
-- Reply: the finish time (ms since the Unix epoch).
local now = now_ms(ARGV[1])
redis.call('HSET', KEYS[1], 'finished_at', int(now), 'removed', ARGV[2], 'took_ms', ARGV[3],
    'stopped_early', ARGV[4])
return now
