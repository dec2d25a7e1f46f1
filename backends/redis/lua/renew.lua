-- renew(KEYS[1]).
-- ARGV: now ('' = server TIME), token, extend by ms, retention ms.
-- Reply: {'OK', fence, attempt, expires_at} | {'L'} lease lost (unchanged) | {'X', detail}
local key = KEYS[1]
local now = now_ms(ARGV[1])
local rec, reply = held(key, now, ARGV[2], true)
if not rec then
    return reply
end
local expires_at = now + tonumber(ARGV[3])
store(key, now, 'i', rec.fence, rec.attempt, expires_at, expires_at + tonumber(ARGV[4]),
    rec.token, rec.fingerprint, false, rec.failure)
return {'OK', rec.fence, rec.attempt, expires_at}
