-- Deletes published records from the outbox, if ARGV[1] still owns it.
--
-- KEYS  1 owner lease
--       2 outbox (stream)
-- ARGV  1 owner
--       2.. stream ids
-- Reply the number deleted, or -1 when ARGV[1] is not the owner

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local n = 0
for i = 2, #ARGV, 500 do
  n = n + redis.call('XDEL', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
return n
