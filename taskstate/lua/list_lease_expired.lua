-- One page of a queue's lease set up to the cutoff: for each task its id,
-- lease score and msg (false when the hash has no msg), then 1 when the page
-- was cut by the cutoff (nothing more to list). It pages by rank: expired
-- entries are the lowest ranks, and ZRANGE by rank finds an offset in
-- O(log n), where ZRANGEBYSCORE … LIMIT walks to it.
--
-- KEYS  1 lease (zset)
--       2 task-key prefix (declared for cluster routing)
-- ARGV  1 cutoff (unix s)
--       2 offset (rank)
--       3 count

local off = tonumber(ARGV[2])
local page = redis.call('ZRANGE', KEYS[1], off, off + tonumber(ARGV[3]) - 1, 'WITHSCORES')
local cutoff = tonumber(ARGV[1])
local res = {}
local ended = 0
if #page < 2 * tonumber(ARGV[3]) then ended = 1 end
for i = 1, #page, 2 do
  if tonumber(page[i+1]) > cutoff then
    ended = 1
    break
  end
  res[#res+1] = page[i]
  res[#res+1] = page[i+1]
  res[#res+1] = redis.call('HGET', KEYS[2] .. page[i], 'msg')
end
res[#res+1] = ended
return res
