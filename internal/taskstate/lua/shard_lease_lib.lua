-- Shared by the shard lease scripts. A lease's value is
-- "<replica> <acquired ms> <renewed ms> <ttl ms>" (Redis TIME); the replica
-- id may hold spaces, so the numbers are read from the right.
--
-- KEYS  none of its own: the including script passes its leases
-- ARGV  none of its own

local function lease_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- lease_holder returns the replica and acquired ms of value v (nil when v
-- is not a lease).
local function lease_holder(v)
  if not v then
    return nil
  end
  local who, acquired = string.match(v, '^(.*) (%d+) %d+ %d+$')
  return who, acquired
end

local function lease_value(owner, acquired, now, ttl)
  return owner .. ' ' .. acquired .. ' ' .. now .. ' ' .. ttl
end
