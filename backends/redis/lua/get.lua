-- get(KEYS[1]): read only.
-- ARGV: now ('' = server TIME).
-- Reply: {'N'} absent | {'X', detail}
--      | {'R', state, token, fence, attempt, expires_at, processed_at, outcome, fingerprint,
--        failure} (missing values are nil)
local rec, reply = found(KEYS[1], now_ms(ARGV[1]), false, {'N'})
if not rec then
    return reply
end
return {'R', rec.state, rec.token, rec.fence, rec.attempt, rec.expires_at or false,
    rec.processed_at or false, rec.outcome, rec.fingerprint, rec.failure or false}
