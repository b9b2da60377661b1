-- Examines one page of the active list, counted from the tail, and repairs
-- the ids that have no lease entry: a lease for a task whose hash says
-- active, removal from the list for the rest.
--
-- KEYS  1 active (list)
--       2 lease (zset)
--       3 task-key prefix
-- ARGV  1 tail offset
--       2 page size
--       3 lease expiry (unix s)
--       4 tombstone
-- Reply {examined, leased ids, removed ids}

local off = tonumber(ARGV[1])
local page = tonumber(ARGV[2])
local ids = redis.call('LRANGE', KEYS[1], -(off + page), -(off + 1))
local n = #ids
local leased, removed = {}, {}
for j = 1, n do
  local id = ids[j]
  if not redis.call('ZSCORE', KEYS[2], id) then
    local h = redis.call('HMGET', KEYS[3] .. id, 'state', 'msg')
    if h[1] == 'active' and h[2] then
      redis.call('ZADD', KEYS[2], 'NX', ARGV[3], id)
      leased[#leased+1] = id
    else
      redis.call('LSET', KEYS[1], -(off + 1 + n - j), ARGV[4])
      removed[#removed+1] = id
    end
  end
end
if #removed > 0 then
  redis.call('LREM', KEYS[1], -#removed, ARGV[4])
end
return {n, leased, removed}
