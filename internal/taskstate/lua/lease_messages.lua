-- The messages of a page of listed lease entries: per id its msg, or, when
-- its hash has no msg, 0 if the id is still in the lease set (a bad task)
-- and 1 if it is not (it finished or was recovered since it was listed).
--
-- KEYS  1 lease (zset)
--       2 task-key prefix (declared for cluster routing)
-- ARGV  the task ids

local res = {}
for i = 1, #ARGV do
  local m = redis.call('HGET', KEYS[2] .. ARGV[i], 'msg')
  if not m then
    if redis.call('ZSCORE', KEYS[1], ARGV[i]) then m = 0 else m = 1 end
  end
  res[i] = m
end
return res
