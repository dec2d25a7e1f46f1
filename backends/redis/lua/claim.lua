-- claim(KEYS[1]).
-- ARGV: now ('' = server TIME), new token, lease ms, fingerprint ('' = none), retention ms.
-- Reply: {'A', fence, attempt, expires_at} | {'I', expires_at, attempt}
--      | {'C', processed_at, outcome or nil} | {'F'} | {'X', detail}
local key = KEYS[1]
local now = now_ms(ARGV[1])
local rec, err = load(key, now)
if err then
    return {'X', err}
end
local fingerprint = ARGV[4]
if fingerprint == '' then
    fingerprint = false
end
local fence, attempt = 1, 1
if rec then
    if fingerprint and rec.fingerprint and rec.fingerprint ~= fingerprint then
        return {'F'}
    end
    if rec.state == 'c' then
        return {'C', rec.processed_at, rec.outcome}
    end
    if now < rec.expires_at then
        return {'I', rec.expires_at, rec.attempt}
    end
    -- Takeover of an expired or released lease.
    fence = rec.fence + 1
    attempt = math.min(rec.attempt + 1, 4294967295)
    if not fingerprint then
        fingerprint = rec.fingerprint
    end
end
local expires_at = now + tonumber(ARGV[3])
local retain_until = expires_at + tonumber(ARGV[5])
-- Replace whatever was there (nothing, a record past its retention, an expired lease).
redis.call('DEL', key)
redis.call('HSET', key, 'state', 'i', 'token', ARGV[2], 'fence', int(fence),
    'attempt', int(attempt), 'expires_at', int(expires_at), 'retain_until', int(retain_until))
if fingerprint then
    redis.call('HSET', key, 'fingerprint', fingerprint)
end
expire_at(key, retain_until, now)
return {'A', fence, attempt, expires_at}
