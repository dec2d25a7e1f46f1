-- Shared prelude, prepended to every dedup-redis script (see src/scripts.rs).
--
-- A record is one HASH:
--   state         'i' (in flight) or 'c' (completed)
--   token         lease token (UUID text); on a completed record, the committing token
--   fence         integer >= 1, +1 per acquisition
--   attempt       integer >= 1, +1 per takeover
--   expires_at    ms since the epoch (in flight only)
--   processed_at  ms since the epoch (completed only)
--   outcome       the committed outcome, byte for byte; the field is absent for "no outcome"
--   fingerprint   the payload fingerprint; absent when no claim carried one
--   retain_until  ms: the record counts as absent from this instant on (by the store's
--                 clock): processed_at + retention, or expires_at + retention in flight.
--                 The key's native expiry (PEXPIRE) is set to the same instant.
--
-- Numbers are written with string.format('%d') (never Lua's tostring, which switches to
-- exponent notation for large values). Lua numbers are doubles: exact up to 2^53, far
-- beyond any millisecond timestamp or fence this store produces.

-- "now" in ms: the injected clock's value when the caller passed one, else the server's TIME
-- (allowed before writes: Redis 7 replicates scripts by their effects).
local function now_ms(arg)
    if arg ~= '' then
        return tonumber(arg)
    end
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
    return string.format('%d', n)
end

local function is_count(n)
    return n ~= nil and n >= 1 and n == math.floor(n)
end

local FIELDS = {
    'state', 'token', 'fence', 'attempt', 'expires_at', 'processed_at', 'outcome',
    'fingerprint', 'retain_until',
}

-- The record at `key` as seen at `now`: (record, nil, true); (nil, nil, present) when absent
-- (present false) or past its retention (present true); or (nil, detail) when the key holds
-- something that is not a dedup record.
--
-- HMGET reads the fields at once. A key of another type answers WRONGTYPE (caught; TYPE then
-- names the type for the detail). All fields nil means no key, or a hash of foreign fields
-- only: only then does EXISTS tell the two apart. Nothing is written here.
local function load(key, now)
    local v = redis.pcall('HMGET', key, unpack(FIELDS))
    if v['err'] then
        if string.find(v['err'], 'WRONGTYPE', 1, true) then
            local kind = redis.call('TYPE', key)['ok']
            return nil, 'the key holds a ' .. kind .. ', not a dedup record (hash)'
        end
        error(v)
    end
    if not v[1] and redis.call('EXISTS', key) == 0 then
        return nil, nil, false
    end
    local r = {
        state = v[1],
        token = v[2],
        fence = tonumber(v[3]),
        attempt = tonumber(v[4]),
        expires_at = tonumber(v[5]),
        processed_at = tonumber(v[6]),
        outcome = v[7],
        fingerprint = v[8],
        retain_until = tonumber(v[9]),
    }
    if r.state ~= 'i' and r.state ~= 'c' then
        return nil, 'field state is ' .. tostring(r.state) .. ", expected 'i' or 'c'"
    end
    if not is_count(r.fence) then
        return nil, 'field fence is missing or not a positive integer'
    end
    if not is_count(r.attempt) then
        return nil, 'field attempt is missing or not a positive integer'
    end
    if r.retain_until == nil then
        return nil, 'field retain_until is missing or not a number'
    end
    if r.state == 'i' then
        if not r.token or r.token == '' then
            return nil, 'in-flight record without a token'
        end
        if r.expires_at == nil then
            return nil, 'in-flight record without a numeric expires_at'
        end
    elseif r.processed_at == nil then
        return nil, 'completed record without a numeric processed_at'
    end
    if r.retain_until <= now then
        return nil, nil, true
    end
    return r, nil, true
end

-- Set the key's native expiry to the record's retain_until.
local function expire_at(key, retain_until, now)
    redis.call('PEXPIRE', key, int(math.max(retain_until - now, 1)))
end
