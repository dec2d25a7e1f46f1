-- commit: op(key, now, retention ms, token, has outcome ('1' / '0'), outcome).
-- Reply: 'OK' committed now (a bare string, as lua/commit_fast.lua's) | {'D'} already committed by this token (unchanged)
--      | {'L'} lease lost (unchanged) | {'X', detail}
-- Run through lua/one.lua (one key) or lua/many.lua (a batch). The common case is
-- lua/commit_fast.lua; this op judges the rest (a layout-1 record is rewritten as layout 2, a
-- layout-3 record keeps its failure's cause).
local function op(key, now, retention, token, has_outcome, outcome)
    local fast = commit_fast(key, now, retention, token, has_outcome, outcome)
    if fast then
        return fast
    end
    local rec, reply = with_token(key, now, token, true)
    if not rec then
        return reply
    end
    if rec.state == 'c' then
        return {'D'}
    end
    store(key, now, 'c', rec.fence, rec.attempt, now, now + retention, token, rec.fingerprint,
        has_outcome == '1' and outcome, rec.failure)
    return 'OK'
end
