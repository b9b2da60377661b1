-- Records one enqueue event in an entry's history as asynq does: trim to
-- cap-1, then add.
--
-- KEYS  1 history (zset)
-- ARGV  1 score (unix s)
--       2 encoded event
--       3 cap
-- Reply 1

redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
return 1
