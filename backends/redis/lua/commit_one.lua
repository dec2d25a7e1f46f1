-- A single commit's common case (lua/commit_fast.lua), tried before lua/record.lua is set up;
-- the rest of the script (the full op through lua/one.lua) runs only when it does not apply.
-- With the server's clock (ARGV[1] empty) it reads no clock: `now` is nil.
-- ARGV: as lua/one.lua.
do
    local now = ARGV[1] ~= '' and tonumber(ARGV[1]) or nil
    local reply = commit_fast(KEYS[1], now, ARGV[2], ARGV[3], ARGV[4], ARGV[5])
    if reply then
        return reply
    end
end
