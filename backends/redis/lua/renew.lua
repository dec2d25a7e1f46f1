-- renew(KEYS[1]).
-- ARGV: now ('' = server TIME), token, extend by ms, retention ms.
-- Reply: {'OK', fence, attempt, expires_at} | {'L'} lease lost (unchanged) | {'X', detail}
local key = KEYS[1]
local now = now_ms(ARGV[1])
local rec, err = load(key, now)
if err then
    return {'X', err}
end
if not rec or rec.state ~= 'i' or rec.token ~= ARGV[2] then
    return {'L'}
end
local expires_at = now + tonumber(ARGV[3])
local retain_until = expires_at + tonumber(ARGV[4])
redis.call('HSET', key, 'expires_at', int(expires_at), 'retain_until', int(retain_until))
expire_at(key, retain_until, now)
return {'OK', rec.fence, rec.attempt, expires_at}
