-- revoke(KEYS[1]): an operator's release (transition::revoke): the lease expires and its
-- token is replaced, so its holder's commit, renew and release are lost; fence and attempt
-- are kept.
-- ARGV: now ('' = server TIME), the token read, force ('1' or '0'), the new token,
--       retention ms.
-- Reply: {'OK'} revoked | {'L'} the record no longer holds the token, or its lease is live
--        and not forced (unchanged) | {'X', detail}
local key = KEYS[1]
local now = now_ms(ARGV[1])
local rec, reply = held(key, now, ARGV[2])
if not rec then
    return reply
end
if rec.expires_at > now and ARGV[3] ~= '1' then
    return {'L'}
end
local expires_at = math.min(rec.expires_at, now)
store(key, now, 'i', rec.fence, rec.attempt, expires_at, expires_at + tonumber(ARGV[5]),
    ARGV[4], rec.fingerprint, false, rec.failure)
return {'OK'}
