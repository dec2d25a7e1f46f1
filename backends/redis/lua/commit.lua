-- commit: op(key, now, retention ms, token, has outcome ('1' / '0'), outcome).
-- Reply: {'OK'} committed now | {'D'} already committed by this token (unchanged)
--      | {'L'} lease lost (unchanged) | {'X', detail}
-- Run through lua/one.lua (one key) or lua/many.lua (a batch). On a layout-2 record: GET,
-- (TIME), SET; the lease's instants are not needed (a fast-path lease's PEXPIRETIME is not read).
local function op(key, now, retention, token, has_outcome, outcome)
    local rec, err = load(key, now, true)
    if err then
        return {'X', err}
    end
    if not rec or rec.token ~= token then
        return {'L'}
    end
    if rec.state == 'c' then
        return {'D'}
    end
    store(key, now, 'c', rec.fence, rec.attempt, now, now + retention, token, rec.fingerprint,
        has_outcome == '1' and outcome)
    return {'OK'}
end
