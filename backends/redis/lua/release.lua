-- release(KEYS[1]), and release_failed: the same, keeping a failure's cause on the record.
-- ARGV: now ('' = server TIME), token, retention ms, and for release_failed the encoded
-- failure (written as layout 3, replacing the cause the record had; without it the record
-- keeps the one it had).
-- Reply: {'OK'} | {'L'} lease lost (unchanged) | {'X', detail}
local key = KEYS[1]
local now = now_ms(ARGV[1])
local rec, reply = held(key, now, ARGV[2])
if not rec then
    return reply
end
local failure = rec.failure
if ARGV[4] and ARGV[4] ~= '' then
    failure = ARGV[4]
end
local expires_at = math.min(rec.expires_at, now)
store(key, now, 'i', rec.fence, rec.attempt, expires_at, expires_at + tonumber(ARGV[3]),
    rec.token, rec.fingerprint, false, failure)
return {'OK'}
