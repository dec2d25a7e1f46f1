-- commit: op(key, now, retention ms, token, has outcome ('1' / '0'), outcome).
-- Reply: {'OK'} committed now | {'D'} already committed by this token (unchanged)
--      | {'L'} lease lost (unchanged) | {'X', detail}
-- Run through lua/one.lua (one key) or lua/many.lua (a batch).
local function op(key, now, retention, token, has_outcome, outcome)
    local rec, err = load(key, now)
    if err then
        return {'X', err}
    end
    if not rec or rec.token ~= token then
        return {'L'}
    end
    if rec.state == 'c' then
        return {'D'}
    end
    local retain_until = now + retention
    -- Only the fields that change: state, processed_at, retain_until and outcome are set
    -- (or outcome removed), expires_at goes.
    local processed_at, until_ = int(now), int(retain_until)
    if has_outcome == '1' then
        redis.call('HSET', key, 'state', 'c', 'processed_at', processed_at,
            'retain_until', until_, 'outcome', outcome)
        redis.call('HDEL', key, 'expires_at')
    else
        redis.call('HSET', key, 'state', 'c', 'processed_at', processed_at,
            'retain_until', until_)
        redis.call('HDEL', key, 'expires_at', 'outcome')
    end
    expire_at(key, retain_until, now)
    return {'OK'}
end
