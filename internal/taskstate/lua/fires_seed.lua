-- Raises an entry's fires counter "<revision> <count>" (the fire limit's
-- count, see fire.lua) to at least count at revision: a counter at an
-- earlier revision, or none, is replaced; one at this revision keeps the
-- higher count; one at a later revision (a newer limit) stays.
--
-- KEYS  1 fires counter
-- ARGV  1 revision
--       2 count
-- Reply the counter after the call

local cur = redis.call('GET', KEYS[1])
if cur then
  local rev, n = string.match(cur, '^(%d+) (%d+)$')
  if rev and (tonumber(rev) > tonumber(ARGV[1]) or (rev == ARGV[1] and tonumber(n) >= tonumber(ARGV[2]))) then
    return cur
  end
end
local v = ARGV[1] .. ' ' .. ARGV[2]
redis.call('SET', KEYS[1], v)
return v
