-- Renews each shard lease of one queue that ARGV[1] holds, and takes again
-- one that is free (it lapsed with no one taking it, or Redis lost it with
-- its data): the holder keeps its shard rather than letting it move for
-- nothing. A lease another replica holds is left alone and reported lost.
-- All keys are in the queue's slot.
--
-- KEYS  shard leases (OwnKeys.ShardLease)
-- ARGV  1 owner (replica id)
--       2 ttl (ms)
-- Reply {Redis TIME ms, then per key 1 renewed, 0 lost}

local now = lease_now()
local ttl = tonumber(ARGV[2])
local out = {now}
for i, k in ipairs(KEYS) do
  local who, acquired = lease_holder(redis.call('GET', k))
  if who == nil then
    redis.call('SET', k, lease_value(ARGV[1], now, now, ttl), 'PX', ttl)
    out[i + 1] = 1
  elseif who == ARGV[1] then
    redis.call('SET', k, lease_value(ARGV[1], acquired, now, ttl), 'PX', ttl)
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
return out
