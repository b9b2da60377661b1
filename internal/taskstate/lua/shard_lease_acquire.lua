-- Takes each free shard lease of one queue for ARGV[1], or renews the ones
-- it already holds (ownership). All keys are in the queue's slot.
--
-- KEYS  shard leases (OwnKeys.ShardLease)
-- ARGV  1 owner (replica id)
--       2 ttl (ms)
-- Reply {Redis TIME ms, then per key 1 held by the owner now, 0 held by
--       another}

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
