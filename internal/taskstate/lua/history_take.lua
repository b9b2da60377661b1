-- Takes an asynq scheduler entry's enqueue history: returns every member
-- with its score and deletes the key, in one step, so the key is empty and
-- a BZPOPMAX on it blocks until asynq records the next event
-- (HistoryCapture).
--
-- KEYS  1 history (zset)
-- ARGV  none
-- Reply member, score, member, score, ... (oldest first)

local taken = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
redis.call('DEL', KEYS[1])
return taken
