-- Closes an entry in its old queue's slot at a revision: writes the marker
-- "<revision> out" unless the marker is at this or a later revision
-- already, raises the revision fence, and returns the slot's watermark.
--
-- KEYS  1 handover marker
--       2 watermark
--       3 revision fence
--       4 marker id
-- ARGV  1 revision
--       2 id of the config message at the revision ("" = unknown)
-- Reply {watermark or "", marker}

raise_fence()
local marker = redis.call('GET', KEYS[1])
if not marker or tonumber(string.match(marker, '^(%d+)')) < tonumber(ARGV[1]) then
  marker = ARGV[1] .. ' out'
  redis.call('SET', KEYS[1], marker)
end
store_id(ARGV[1] .. ' out', ARGV[2])
return {redis.call('GET', KEYS[2]) or '', marker}
