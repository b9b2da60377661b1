-- Releases each shard lease of one queue that ARGV[1] holds, so the
-- shard's next owner takes it at once rather than after its expiry. A
-- lease held by another replica is left alone. All keys are in the queue's
-- slot.
--
-- KEYS  shard leases (OwnKeys.ShardLease)
-- ARGV  1 owner (replica id)
-- Reply per key 1 released, 0 not the owner's

local out = {}
for i, k in ipairs(KEYS) do
  local who = lease_holder(redis.call('GET', k))
  if who == ARGV[1] then
    redis.call('DEL', k)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
