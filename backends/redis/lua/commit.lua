-- commit(KEYS[1]).
-- ARGV: now ('' = server TIME), token, has outcome ('1' / '0'), outcome, retention ms.
-- Reply: {'OK'} committed now | {'D'} already committed by this token (unchanged)
--      | {'L'} lease lost (unchanged) | {'X', detail}
local key = KEYS[1]
local now = now_ms(ARGV[1])
local rec, err = load(key, now)
if err then
    return {'X', err}
end
if not rec or rec.token ~= ARGV[2] then
    return {'L'}
end
if rec.state == 'c' then
    return {'D'}
end
local retain_until = now + tonumber(ARGV[5])
redis.call('HSET', key, 'state', 'c', 'processed_at', int(now), 'retain_until', int(retain_until))
redis.call('HDEL', key, 'expires_at')
if ARGV[3] == '1' then
    redis.call('HSET', key, 'outcome', ARGV[4])
else
    redis.call('HDEL', key, 'outcome')
end
expire_at(key, retain_until, now)
return {'OK'}
