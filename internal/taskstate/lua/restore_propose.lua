-- Proposes, or reads, the seed of an entry's lost watermark (Restore): the
-- slot's restore proposals hold, per entry, the highest tick proposed and
-- when the proposal settles (Redis TIME at its creation plus the settle
-- delay its creator asked for). A proposal only ever moves to a higher tick;
-- the settle instant stays the creation's.
--
-- With no proposal for the entry, a watermark at or past the tick
-- proposed means another replica has restored it already: nothing is
-- proposed. A proposal at or below the watermark is a leftover of a
-- restore done, and is dropped.
--
-- KEYS  1 restore proposals (HASH entry -> "<tick ms> <settles at ms> <task id>")
--       2 the entry's watermark
-- ARGV  1 entry
--       2 tick proposed (unix ms; "" = none: read only; -1 = open a
--         proposal without a position, below any tick, for others to raise)
--       3 its task id
--       4 settle delay of a new proposal (ms)
-- Reply {0} none | {1, tick, task id, ms left} settling | {2, tick, task id} settled
--       | {3} restored already

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tick, at, task
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  tick, at, task = string.match(cur, '^(%-?%d+) (%-?%d+) (.*)$')
end
local wm = redis.call('GET', KEYS[2])
local wm_ms = wm and tonumber(string.match(wm, '^(%-?%d+)'))
if tick and wm_ms and wm_ms >= tonumber(tick) then
  -- Left over from a restore that seeded the watermark: a later loss
  -- must wait for the replicas' positions again.
  redis.call('HDEL', KEYS[1], ARGV[1])
  tick = nil
end
if not tick and wm_ms and (ARGV[2] == '' or wm_ms >= tonumber(ARGV[2])) then
  return {3}
end
if ARGV[2] ~= '' then
  if not tick then
    tick, at, task = ARGV[2], string.format('%.0f', now + tonumber(ARGV[4])), ARGV[3]
    redis.call('HSET', KEYS[1], ARGV[1], tick .. ' ' .. at .. ' ' .. task)
  elseif tonumber(ARGV[2]) > tonumber(tick) then
    tick, task = ARGV[2], ARGV[3]
    redis.call('HSET', KEYS[1], ARGV[1], tick .. ' ' .. at .. ' ' .. task)
  end
end
if not tick then
  return {0}
end
local left = tonumber(at) - now
if left > 0 then
  return {1, tick, task, left}
end
return {2, tick, task}
