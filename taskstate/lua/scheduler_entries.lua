-- Replaces a scheduler's entries list as asynq does: DEL, LPUSH each (the
-- list ends up reversed), EXPIRE.
--
-- KEYS  1 entries list
-- ARGV  1 ttl (s)
--       2.. encoded entries
-- Reply 1

redis.call('DEL', KEYS[1])
for i = 2, #ARGV do
  redis.call('LPUSH', KEYS[1], ARGV[i])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
