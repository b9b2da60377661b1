-- Drops the outbox lease if ARGV[1] holds it.
--
-- KEYS  1 owner lease
-- ARGV  1 owner
-- Reply 1 released, 0 not the owner

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
