-- commit_fast(key, now, retention ms, token, has outcome ('1' / '0'), outcome): the common
-- commit, an in-flight layout-2 record held by `token`, in two commands (GET, one
-- string.match, SET) and without lua/record.lua's setup, which costs more server time than
-- the commit itself. The fingerprint part of the value is copied as it is (a record in flight
-- has no outcome: it is the value's tail).
--
-- `now` nil: the server's clock, not read. The record written is then a 'd' (see
-- lua/record.lua): it holds the retention, and the key's native expiry (`PX retention`, set by
-- the server on its own clock) holds processed_at + retention. No `TIME` and no number
-- formatting: together they were a third of a single commit's server time. Nothing to compare
-- retain_until with either: a record past its retention by the server's clock has expired.
-- `now` a number (a batch's one "now", or an injected clock's): a 'c' with the instants.
-- `retention`: the ARGV text itself (a single commit) or a number (a batch). The text written
-- is made once per call of the script, not once per key.
-- Reply: 'OK' (a bare string: a reply table per key costs as much server time as the GET),
-- or nil for anything else (another layout, a completed record, another token, a value that
-- does not parse, a record past its retention by an injected clock), which lua/commit.lua's
-- op then judges with the full record checks.
local stamped_now, stamped_retention, head, stamps, px
local function commit_fast(key, now, retention, token, has_outcome, outcome)
    local v = redis.pcall('GET', key)
    if type(v) ~= 'string' then
        return nil
    end
    local state, fence, attempt, retain_until, held, tail, fp_len, fp_at = string.match(v,
        '^2,([il]),([1-9]%d*),([1-9]%d*),%-?%d+,(%-?%d+),([^,]+),()(%d+),()')
    if held ~= token or #v + 1 - fp_at ~= tonumber(fp_len)
        or (now and state == 'i' and tonumber(retain_until) <= now) then
        return nil
    end
    -- `head` is nil until the first key is stamped (`now` itself may be nil).
    if not head or stamped_now ~= now or stamped_retention ~= retention then
        stamped_now, stamped_retention = now, retention
        px = type(retention) == 'string' and retention or int(math.max(retention, 1))
        if now then
            head, stamps = '2,c,', ',' .. int(now) .. ',' .. int(now + retention) .. ','
        else
            head, stamps = '2,d,', ',0,' .. px .. ','
        end
    end
    local value = head .. fence .. ',' .. attempt .. stamps .. token .. ','
        .. string.sub(v, tail)
    if has_outcome == '1' then
        value = value .. ',' .. outcome
    end
    redis.call('SET', key, value, 'PX', px)
    return 'OK'
end
