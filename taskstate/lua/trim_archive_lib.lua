-- Shared by recover.lua and trim_archive.lua (prepended to each), with
-- their KEYS and ARGV layout (recover.lua's header).
--
-- trim_archive is asynq's archive trim (age first, then size, deleting the
-- hashes of trimmed tasks), limited to ARGV[6] members per call so that a
-- huge backlog cannot make one script slow or overflow unpack. It returns
-- 1 when members were left for another call.
local function trim_archive()
  local budget = tonumber(ARGV[6])
  local more = 0
  local old = redis.call('ZRANGE', KEYS[4], '-inf', ARGV[4], 'BYSCORE', 'LIMIT', 0, budget)
  for i = 1, #old, 500 do
    local last = math.min(i + 499, #old)
    for j = i, last do redis.call('DEL', KEYS[9] .. old[j]) end
    redis.call('ZREM', KEYS[4], unpack(old, i, last))
  end
  if #old == budget then return 1 end
  budget = budget - #old
  local excess = redis.call('ZCARD', KEYS[4]) - (tonumber(ARGV[5]) - 1)
  if excess > 0 then
    local m = math.min(excess, budget)
    if m > 0 then
      local ids = redis.call('ZRANGE', KEYS[4], 0, m - 1)
      for j = 1, #ids do redis.call('DEL', KEYS[9] .. ids[j]) end
      redis.call('ZREMRANGEBYRANK', KEYS[4], 0, m - 1)
    end
    if m < excess then more = 1 end
  end
  return more
end

