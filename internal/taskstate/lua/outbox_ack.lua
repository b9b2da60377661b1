-- Deletes published records from the outbox and extends ARGV[1]'s lease,
-- unless another relay holds it. A lease that lapsed during a long pass
-- and that nobody took is taken again: the records are published either
-- way, and a relay whose passes outlast the lease would otherwise never
-- delete what it published.
--
-- KEYS  1 owner lease
--       2 outbox (stream)
-- ARGV  1 owner
--       2 ttl (ms)
--       3.. stream ids
-- Reply the number deleted, or -1 when another relay holds the lease

local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local n = 0
for i = 3, #ARGV, 500 do
  n = n + redis.call('XDEL', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
return n
