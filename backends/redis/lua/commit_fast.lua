-- commit_fast(key, now, retention ms, token, has outcome ('1' / '0'), outcome): the common
-- commit, an in-flight layout-2 record held by `token`, in three commands (GET, one
-- string.match, SET; "now" comes from the caller) and without lua/record.lua's setup, which
-- costs more server time than the commit itself. The fingerprint part of the value is
-- copied as it is (a record in flight has no outcome: it is the value's tail).
-- The timestamps' text is formatted once per call of the script, not once per key (a batch
-- shares one "now"). Reply: 'OK' (a bare string: a reply table per key costs as much
-- server time as the GET), or nil for anything else (another layout, a completed record, another
-- token, a value that does not parse, a record past its retention by an injected clock),
-- which lua/commit.lua's op then judges with the full record checks.
local stamped_now, stamped_retention, stamps, px
local function commit_fast(key, now, retention, token, has_outcome, outcome)
    local v = redis.pcall('GET', key)
    if type(v) ~= 'string' then
        return nil
    end
    local state, fence, attempt, retain_until, held, tail, fp_len, fp_at = string.match(v,
        '^2,([il]),([1-9]%d*),([1-9]%d*),%-?%d+,(%-?%d+),([^,]+),()(%d+),()')
    if held ~= token or #v + 1 - fp_at ~= tonumber(fp_len)
        or (state == 'i' and tonumber(retain_until) <= now) then
        return nil
    end
    if stamped_now ~= now or stamped_retention ~= retention then
        stamped_now, stamped_retention = now, retention
        stamps = ',' .. int(now) .. ',' .. int(now + retention) .. ','
        px = int(math.max(retention, 1))
    end
    local value = '2,c,' .. fence .. ',' .. attempt .. stamps .. token .. ','
        .. string.sub(v, tail)
    if has_outcome == '1' then
        value = value .. ',' .. outcome
    end
    redis.call('SET', key, value, 'PX', px)
    return 'OK'
end
