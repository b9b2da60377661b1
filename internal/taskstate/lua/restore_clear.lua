-- Deletes an entry's restore proposal once its watermark was seeded from
-- it, when it still proposes that tick (compare first: a replica may have
-- raised it meanwhile; a raised proposal is seeded on its own).
--
-- KEYS  1 restore proposals
-- ARGV  1 entry
--       2 tick seeded (unix ms)
-- Reply 1 deleted, 0 not

local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and string.match(cur, '^(%-?%d+) ') == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
