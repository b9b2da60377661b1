-- Deletes each of KEYS (one queue's slot) that still holds the value in the
-- same place of ARGV.
--
-- KEYS  1..n keys
-- ARGV  1..n the value each key must still hold
-- Reply {number deleted}

local n = 0
for i, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[i] then
    redis.call('DEL', k)
    n = n + 1
  end
end
return {n}
