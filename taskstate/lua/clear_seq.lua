-- Deletes a revision fence or handover marker, and the id stored beside it,
-- when the sequence it starts with ("<seq>" or "<seq> <in|out>") is
-- ARGV[1] (compare first: another replica may have raised it meanwhile).
--
-- KEYS  1 fence or marker
--       2 (optional) the id stored beside it
-- ARGV  1 sequence
-- Reply 1 deleted, 0 not

local v = redis.call('GET', KEYS[1])
if v and string.match(v, '^(%d+)') == ARGV[1] then
  redis.call('DEL', unpack(KEYS))
  return 1
end
return 0
