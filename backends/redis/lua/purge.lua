-- purge: op(key, now, purge retention ms): remove the record if purge(retention) at now
-- removes it (UNLINK: a large outcome is freed off the main thread).
-- Reply: 'c' completed record removed | 'e' expired in-flight record removed
--      | 'g' record past the store's own retention (already absent): deleted, not counted
--      | '' kept or nothing there | 'x' not a dedup record: left alone
-- Run by lua/purge_step.lua on the keys a step's SCAN found, and through lua/many.lua (one
-- call per hash slot) on keys whose slot moved since: the prelude's setup is paid once per
-- call, not once per key.
local function op(key, now, retention)
    local rec, err, present = load(key, now)
    if err then
        return 'x'
    end
    if not present then
        return ''
    end
    if not rec then
        redis.call('UNLINK', key)
        return 'g'
    end
    local cutoff = now - retention
    if rec.state == 'c' and rec.processed_at < cutoff then
        redis.call('UNLINK', key)
        return 'c'
    end
    -- A live lease has expires_at > now >= cutoff: never removed.
    if rec.state == 'i' and rec.expires_at < cutoff and rec.expires_at <= now then
        redis.call('UNLINK', key)
        return 'e'
    end
    return ''
end
