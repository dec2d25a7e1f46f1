-- Shared prelude, prepended to every dedup-redis script after lua/now.lua (see src/scripts.rs).
--
-- A record is one Redis STRING, layout 2 (every write of a record without a failure's cause)
-- or layout 3 (every write of a record with one):
--
--   2,<state>,<fence>,<attempt>,<a>,<b>,<token>,<fingerprint length>,<fingerprint>[,<outcome>]
--   3,<state>,<fence>,<attempt>,<a>,<b>,<token>,<fingerprint length>,<fingerprint>,
--     <failure length>,<failure>[,<outcome>]
--
--   2 / 3         the layout version: always first
--   state         'i' in flight: a = expires_at, b = retain_until (ms since the epoch)
--                 'c' completed: a = processed_at, b = retain_until (ms since the epoch)
--                 'l' in flight, written by a claim of a fresh key under the server's clock
--                     (a plain SET ... NX PX, no script: src/schema.rs): a = the lease and
--                     b = the retention in ms. The key's native expiry (PX lease + retention)
--                     holds the instants, set by the server on its own clock:
--                     retain_until = PEXPIRETIME, expires_at = retain_until - b.
--                 'd' completed, written by a single commit under the server's clock
--                     (lua/commit_fast.lua, which reads no clock): a = 0 and b = the
--                     retention in ms. The key's native expiry (PX retention, set by the
--                     server) holds the instants: retain_until = PEXPIRETIME,
--                     processed_at = retain_until - b.
--   fence         integer >= 1, +1 per acquisition
--   attempt       integer >= 1, +1 per takeover
--   token         lease token; on a completed record, the committing token. Written in Z85 (the
--                 token's 16 bytes, 20 characters, no comma: src/token.rs), as clients send
--                 it; records written by dedup-redis before that hold the UUID text (36
--                 characters), which same_token below still matches
--   fingerprint   the payload fingerprint, any bytes but NUL, after its length in bytes
--                 (0 and nothing: no fingerprint)
--   failure       layout 3 only: the latest released failure's cause (Record::last_failure,
--                 the encoded dedup_core::Failure, 1 to 4096 bytes, any bytes), after its
--                 length in bytes. Written by lua/release.lua when given one, kept by every
--                 later write of the key (takeover, renew, release, commit, revoke)
--   outcome       completed only: after a comma, the outcome byte for byte, to the end of the
--                 value. No comma there means "no outcome"; a comma and nothing "empty".
--   retain_until  the record counts as absent from this instant on (by the store's clock):
--                 processed_at + retention, or expires_at + retention in flight. The key's
--                 native expiry (PX) is set to the same instant by every write.
--
-- Layout 1 (dedup-redis before layout 2) is a HASH with the fields state, token, fence,
-- attempt, expires_at, processed_at, outcome (absent: no outcome), fingerprint, retain_until,
-- same meanings. Every script still reads it (GET answers WRONGTYPE, then HMGET); every
-- write replaces it with layout 2. A dedup-redis that only knows layout 1 answers every
-- operation on a layout-2 record with Error::Corrupt ("holds a string"), never "absent":
-- upgrade every process sharing a prefix together. Layout 2 is what the client's fast paths
-- write and compare (src/schema.rs, lua/commit_fast.lua); they leave a layout-3 record to the
-- scripts. A dedup-redis that only knows layout 2 answers every operation on a layout-3
-- record with Error::Corrupt ("not a dedup record (layout 2)"), never "absent".
--
-- Numbers are written with string.format('%d') (never Lua's tostring, which switches to
-- exponent notation for large values). Lua numbers are doubles: exact up to 2^53, far
-- beyond any millisecond timestamp or fence this store produces.

local function is_count(n)
    return n ~= nil and n >= 1 and n == math.floor(n)
end

-- Whether a record's token `held` is the caller's `token` (Z85, as clients send it): the same
-- text, or `held` is the UUID text of the same 16 bytes, as records written before Z85 hold
-- it (a lease handed out by an earlier dedup-redis, or a token an operator read from one).
-- The conversion runs only for such a record, never on a Z85 one.
local Z85 = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#'
local function same_token(held, token)
    if held == token then
        return true
    end
    if type(held) ~= 'string' or #held ~= 36 or #token ~= 20 then
        return false
    end
    local hex = {}
    for i = 1, 16, 5 do
        local n = 0
        for j = i, i + 4 do
            local d = string.find(Z85, string.sub(token, j, j), 1, true)
            if not d then
                return false
            end
            n = n * 85 + d - 1
        end
        if n >= 4294967296 then
            return false
        end
        hex[#hex + 1] = string.format('%08x', n)
    end
    local h = table.concat(hex)
    return string.lower(held) == string.sub(h, 1, 8) .. '-' .. string.sub(h, 9, 12) .. '-'
        .. string.sub(h, 13, 16) .. '-' .. string.sub(h, 17, 20) .. '-' .. string.sub(h, 21, 32)
end

local FIELDS = {
    'state', 'token', 'fence', 'attempt', 'expires_at', 'processed_at', 'outcome',
    'fingerprint', 'retain_until',
}

-- A layout-1 record (a HASH), or (nil, detail) for a key of a type that is neither.
local function load_hash(key)
    local v = redis.pcall('HMGET', key, unpack(FIELDS))
    if v['err'] then
        if string.find(v['err'], 'WRONGTYPE', 1, true) then
            local kind = redis.call('TYPE', key)['ok']
            return nil, 'the key holds a ' .. kind .. ', not a dedup record (string or hash)'
        end
        error(v)
    end
    if not v[1] and redis.call('EXISTS', key) == 0 then
        return nil
    end
    return {
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
end

-- A layout-2 record (the STRING `v`), or (nil, detail). A fast-path lease ('l') and a
-- fast-path commit ('d') get their instants from the key's PEXPIRETIME, unless `lazy` (the
-- caller needs none of expires_at, processed_at and retain_until: a live key is within its
-- retention).
local function parse(key, v, now, lazy)
    local version, state, fence, attempt, a, b, token, fp_len, at = string.match(v,
        '^([23]),(%a),(%d+),(%d+),(%-?%d+),(%-?%d+),([^,]*),(%d+),()')
    if not state then
        return nil, 'the key holds a string that is not a dedup record (layout 2 or 3)'
    end
    fp_len = tonumber(fp_len)
    local fingerprint = false
    if fp_len > 0 then
        fingerprint = string.sub(v, at, at + fp_len - 1)
        if #fingerprint ~= fp_len then
            return nil, 'the fingerprint is shorter than its length'
        end
    end
    local rest = at + fp_len
    local failure = false
    if version == '3' then
        local f_len, f_at = string.match(v, '^,([1-9]%d*),()', rest)
        if not f_len then
            return nil, 'a layout-3 record without a failure length after the fingerprint'
        end
        f_len = tonumber(f_len)
        failure = string.sub(v, f_at, f_at + f_len - 1)
        if #failure ~= f_len then
            return nil, 'the failure is shorter than its length'
        end
        rest = f_at + f_len
    end
    local outcome = false
    if #v >= rest then
        if string.byte(v, rest) ~= 44 then
            return nil, 'unexpected bytes after the fingerprint'
        end
        outcome = string.sub(v, rest + 1)
    end
    a, b = tonumber(a), tonumber(b)
    local r = {
        state = state,
        token = token,
        fence = tonumber(fence),
        attempt = tonumber(attempt),
        outcome = outcome,
        fingerprint = fingerprint,
        failure = failure,
        retain_until = b,
    }
    if state == 'c' then
        r.processed_at = a
    elseif state == 'i' then
        r.expires_at = a
    elseif state == 'l' or state == 'd' then
        local lease = state == 'l'
        r.state = lease and 'i' or 'c'
        if lazy then
            r.lazy = true
            r.retain_until = now + 1
        else
            local at = redis.call('PEXPIRETIME', key)
            if at < 0 then
                return nil, lease and 'a fast-path lease without an expiry'
                    or 'a fast-path commit without an expiry'
            end
            r.retain_until = at
            if lease then
                r.expires_at = at - b
            else
                r.processed_at = at - b
            end
        end
    end
    return r
end

-- The record at `key` as seen at `now`: (record, nil, true); (nil, nil, present) when absent
-- (present false) or past its retention (present true); or (nil, detail) when the key holds
-- something that is not a dedup record. `lazy`: see parse. Nothing is written here.
--
-- GET reads a layout-2 record at once; a HASH (layout 1) answers WRONGTYPE and is read with
-- HMGET; any other type is reported with its name.
local function load(key, now, lazy)
    local v = redis.pcall('GET', key)
    local r, err
    if type(v) == 'table' and v['err'] then
        if not string.find(v['err'], 'WRONGTYPE', 1, true) then
            error(v)
        end
        r, err = load_hash(key)
    elseif v then
        r, err = parse(key, v, now, lazy)
    end
    if err then
        return nil, err
    end
    if not r then
        return nil, nil, false
    end
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
    if r.token == '' then
        r.token = false
    end
    if r.state == 'i' then
        if not r.token then
            return nil, 'in-flight record without a token'
        end
        if r.expires_at == nil and not r.lazy then
            return nil, 'in-flight record without a numeric expires_at'
        end
    elseif r.processed_at == nil and not r.lazy then
        return nil, 'completed record without a numeric processed_at'
    end
    if r.retain_until <= now then
        return nil, nil, true
    end
    return r, nil, true
end

-- `load` for a one-key script: (record), or (nil, the script's reply): {'X', detail} for a
-- key that holds something that is not a dedup record, `absent` when there is no record.
local function found(key, now, lazy, absent)
    local rec, err = load(key, now, lazy)
    if err then
        return nil, {'X', err}
    end
    if not rec then
        return nil, absent
    end
    return rec
end

-- The record at `key` when it holds the caller's `token` (in flight, or completed by it), or
-- (nil, the script's reply): {'L'} lease lost, or {'X', detail} as `found`.
local function with_token(key, now, token, lazy)
    local rec, reply = found(key, now, lazy, {'L'})
    if rec and not same_token(rec.token, token) then
        return nil, {'L'}
    end
    return rec, reply
end

-- The caller's lease at `key`: the record when it is in flight under `token`, or (nil, the
-- script's reply) as `with_token`.
local function held(key, now, token, lazy)
    local rec, reply = with_token(key, now, token, lazy)
    if rec and rec.state ~= 'i' then
        return nil, {'L'}
    end
    return rec, reply
end

-- Write a record (replacing whatever the key held: a layout-1 hash too), with the key's
-- native expiry at retain_until: layout 2, or layout 3 when it keeps a `failure`. `a`:
-- expires_at in flight ('i'), processed_at when completed ('c'); `outcome`: false for none
-- (completed only); `failure`: the encoded cause, false or nil for none.
local function store(key, now, state, fence, attempt, a, retain_until, token, fingerprint, outcome,
                     failure)
    local fp = fingerprint or ''
    local version = failure and '3,' or '2,'
    local v = version .. state .. ',' .. int(fence) .. ',' .. int(attempt) .. ',' .. int(a) .. ','
        .. int(retain_until) .. ',' .. (token or '') .. ',' .. #fp .. ',' .. fp
    if failure then
        v = v .. ',' .. #failure .. ',' .. failure
    end
    if outcome then
        v = v .. ',' .. outcome
    end
    redis.call('SET', key, v, 'PX', int(math.max(retain_until - now, 1)))
end
