-- Takes or extends the lease naming the one relay that publishes a slot's
-- outbox.
--
-- KEYS  1 owner lease
-- ARGV  1 owner
--       2 ttl (ms)
-- Reply 1 owned, 0 another owner holds it

local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
