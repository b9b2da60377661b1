-- Deletes each of the first n KEYS (one queue's slot) that still holds the
-- value in the same place of ARGV; a held tick (a hash, OwnKeys.Held) is
-- compared by its task id and also leaves the slot's held index.
--
-- KEYS  1..n keys, then optionally the slot's held index (OwnKeys.HeldIndex)
-- ARGV  1..n the value each key must still hold
-- Reply {number deleted}

local n = 0
local index = KEYS[#ARGV + 1]
for i = 1, #ARGV do
  local k = KEYS[i]
  if redis.call('TYPE', k).ok == 'hash' then
    if redis.call('HGET', k, 'task') == ARGV[i] then
      redis.call('DEL', k)
      if index then redis.call('SREM', index, k) end
      n = n + 1
    end
  elseif redis.call('GET', k) == ARGV[i] then
    redis.call('DEL', k)
    n = n + 1
  end
end
return {n}
