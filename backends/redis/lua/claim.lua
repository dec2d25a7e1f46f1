-- claim: op(key, now, retention ms, new token, lease ms, fingerprint ('' = none)).
-- Reply: {'A', fence, attempt, expires_at} | {'I', expires_at, attempt}
--      | {'C', processed_at, outcome or nil} | {'F'} | {'X', detail}
-- Run through lua/one.lua (one key) or lua/many.lua (a batch).
local function op(key, now, retention, token, lease_ms, fingerprint)
    -- Most claims are of new keys: EXISTS settles those without reading fields.
    local rec, err, present = nil, nil, redis.call('EXISTS', key) == 1
    if present then
        rec, err, present = load(key, now)
    end
    if err then
        return {'X', err}
    end
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
    local expires_at = now + tonumber(lease_ms)
    local retain_until = expires_at + retention
    -- Replace whatever was there (a record past its retention, an expired lease): other fields
    -- of the old record must not survive. A fresh key needs no DEL.
    if present then
        redis.call('DEL', key)
    end
    if fingerprint then
        redis.call('HSET', key, 'state', 'i', 'token', token, 'fence', int(fence),
            'attempt', int(attempt), 'expires_at', int(expires_at), 'retain_until', int(retain_until),
            'fingerprint', fingerprint)
    else
        redis.call('HSET', key, 'state', 'i', 'token', token, 'fence', int(fence),
            'attempt', int(attempt), 'expires_at', int(expires_at), 'retain_until', int(retain_until))
    end
    expire_at(key, retain_until, now)
    return {'A', fence, attempt, expires_at}
end
