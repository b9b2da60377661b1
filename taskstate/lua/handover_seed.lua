-- Opens an entry in its new queue's slot at a revision: writes the marker
-- "<revision> in", raises the revision fence, and raises the watermark to
-- the one given when the slot has none or an older one. Refused when the
-- marker is at a later revision, or closed ("out") at this one.
--
-- KEYS  1 handover marker
--       2 watermark
--       3 revision fence
--       4 marker id
-- ARGV  1 revision
--       2 watermark (unix ms, "" = none)
--       3 its task id
--       4 id of the config message at the revision ("" = unknown)
-- Reply {1 seeded | 0 superseded, marker}

local marker = redis.call('GET', KEYS[1])
if marker then
  local rev = tonumber(string.match(marker, '^(%d+)'))
  local rev_in = tonumber(ARGV[1])
  if rev > rev_in or (rev == rev_in and string.sub(marker, -4) == ' out') then
    return {0, marker}
  end
end
marker = ARGV[1] .. ' in'
redis.call('SET', KEYS[1], marker)
store_id(marker, ARGV[4])
raise_fence()
if ARGV[2] ~= '' then
  local cur = redis.call('GET', KEYS[2])
  if not cur or tonumber(string.match(cur, '^(-?%d+)')) < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[3])
  end
end
return {1, marker}
