-- Opens an entry in its new queue's slot at a revision: writes the marker
-- "<revision> in", raises the revision fence, and raises the watermark to
-- the one given when the slot has none or an older one. Refused when the
-- marker is at a later revision, or closed ("out") at this one.
--
-- A restore (RestoreWatermark) also appends the record of the fires it
-- found lost, in the same step, but only when it raises the watermark from
-- the value the loss was computed against: of the replicas restoring one
-- loss, exactly one records it.
--
-- KEYS  1 handover marker
--       2 watermark
--       3 revision fence
--       4 marker id
--       5 outbox
-- ARGV  1 revision
--       2 watermark (unix ms, "" = none)
--       3 its task id
--       4 id of the config message at the revision ("" = unknown)
--       5 the watermark the loss was found at (unix ms, "" = none)
--       6 the lost record's event id ("" = no record)
--       7 its data
-- Reply {1 seeded | 0 superseded, marker, 1 when the record was appended}

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
local recorded = 0
if ARGV[2] ~= '' then
  local cur = redis.call('GET', KEYS[2])
  local cur_ms = cur and string.match(cur, '^(-?%d+)')
  if not cur or tonumber(cur_ms) < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[3])
    if ARGV[6] and ARGV[6] ~= '' and (cur_ms or '') == ARGV[5] then
      redis.call('XADD', KEYS[5], '*', 'id', ARGV[6], 'data', ARGV[7])
      recorded = 1
    end
  end
end
return {1, marker, recorded}
