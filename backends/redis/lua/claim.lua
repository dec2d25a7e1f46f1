-- claim: op(key, now, retention ms, new token, lease ms, fingerprint ('' = none)).
-- Reply: {'A', fence, attempt, expires_at} | {'I', expires_at, attempt}
--      | {'C', processed_at, outcome or nil} | {'F'} | {'X', detail}
-- Run through lua/one.lua (one key) or lua/many.lua (a batch). A claim of a fresh key never
-- gets here: the client's `SET ... NX PX ... GET` acquires it (src/schema.rs); this script
-- runs for a key that existed then (in flight, a layout-1 record, past its retention by an
-- injected clock), or on a key repeated in a batch.
local function op(key, now, retention, token, lease_ms, fingerprint)
    local rec, err = load(key, now)
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
    -- SET replaces whatever was there (a record past its retention, an expired lease, a
    -- layout-1 hash): nothing of the old record survives but, on a takeover, its fence,
    -- attempt, fingerprint and failure's cause.
    store(key, now, 'i', fence, attempt, expires_at, expires_at + retention, token, fingerprint,
        false, rec and rec.failure)
    return {'A', fence, attempt, expires_at}
end
