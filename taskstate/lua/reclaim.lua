-- Returns one stale aggregation set to its group, as asynq's
-- ReclaimStaleAggregationSets does (members copied back with their scores,
-- set deleted, set removed from aggregation_sets), and beyond asynq adds the
-- group back to the groups set, so the aggregator visits it again, and
-- appends the outbox record. It does nothing when the set is no longer
-- listed as stale (another reclaimer, or the aggregator, got there first).
--
-- KEYS  1 aggregation_sets
--       2 set
--       3 group
--       4 groups
--       5 outbox
-- ARGV  1 now (unix s)
--       2 group name
--       3 event id
--       4 record data
-- Reply {tasks moved (-1 = not stale any more), stream id}

local score = redis.call('ZSCORE', KEYS[1], KEYS[2])
if not score or tonumber(score) > tonumber(ARGV[1]) then
  return {-1, ''}
end
local n = redis.call('ZCARD', KEYS[2])
local xid = ''
if n > 0 then
  xid = redis.call('XADD', KEYS[5], '*', 'id', ARGV[3], 'data', ARGV[4])
  for start = 0, n - 1, 500 do
    local m = redis.call('ZRANGE', KEYS[2], start, start + 499, 'WITHSCORES')
    local args = {}
    for i = 1, #m, 2 do
      args[#args+1] = m[i+1]
      args[#args+1] = m[i]
    end
    if #args > 0 then redis.call('ZADD', KEYS[3], unpack(args)) end
  end
  redis.call('DEL', KEYS[2])
  redis.call('SADD', KEYS[4], ARGV[2])
end
redis.call('ZREM', KEYS[1], KEYS[2])
return {n, xid}
