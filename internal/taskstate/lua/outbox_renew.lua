-- Extends the outbox lease if ARGV[1] holds it; never takes a free one.
--
-- KEYS  1 owner lease
-- ARGV  1 owner
--       2 ttl (ms)
-- Reply 1 renewed, 0 not the owner

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
