-- forget(KEYS[1]): an operator removes the key's record (transition::forget).
-- ARGV: now ('' = server TIME), force ('1' or '0').
-- Reply: {'F', status, fence, attempt, outcome} removed; status 'i' (live lease, forced),
--        'e' (lease expired or released), 'c' (completed, with its outcome: nil for none)
--      | {'H', expires_at, attempt} a live lease and no force (unchanged)
--      | {'N'} absent (unchanged) | {'X', detail}
local key = KEYS[1]
local now = now_ms(ARGV[1])
local rec, reply = found(key, now, false, {'N'})
if not rec then
    return reply
end
local status = 'c'
if rec.state == 'i' then
    status = rec.expires_at > now and 'i' or 'e'
end
if status == 'i' and ARGV[2] ~= '1' then
    return {'H', rec.expires_at, rec.attempt}
end
redis.call('DEL', key)
return {'F', status, rec.fence, rec.attempt, rec.outcome}
