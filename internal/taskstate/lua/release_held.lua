-- Releases (or drops) one entry's held tick (overlap buffer-one), in one
-- atomic step: a compare-and-set on the held tick's task id, so that of the
-- replicas checking the slot at once exactly one fires it. The release
-- presents the releasing replica's fences and is refused by them as a fire
-- would be (fences_lib.lua), so a replica whose projection lags cannot fire
-- (or drop) a held tick of an entry a newer configuration paused, removed
-- or moved off buffer-one. A release counts against the entry's fire
-- limit as a fire does (fire.lua), checked and moved in the same step.
--
-- KEYS  1 the entry's held tick (OwnKeys.Held), 2 the slot's held index,
--       3 the entry's watermark, 4 its handover marker, 5 the held task's
--       hash, 6 the previous task's hash, 7 asynq's pending list, 8 the
--       slot's outbox, 9 the revision fence, 10 the staleness fence, 11
--       the fence's config message id, 12 the slot's count of dropped
--       held ticks (OwnKeys.HeldDrops), 13 the entry's fires counter
--       "<revision> <count>" (OwnKeys.Fires)
-- ARGV  1 the held task id the caller read, 2 "drop" to drop the tick
--       instead of firing it, 3 config "<seq>" or "<seq>:<id>", 4
--       fresh_as_of ms ("" = not presented), 5 max staleness ms (as a
--       fire's head), 6 and 7 the dropped record's id and data
--       (a skipped event), appended when the tick is dropped ("" = none), 8
--       the entry's max_fires (0 = no limit), 9 the revision it counts from
-- Reply {code, extra}: 1 released (fired, pending), 2 waiting (the
--       previous task is still busy; extra is its state), 0 gone (no such
--       held tick: released or dropped already), 3 dropped (asked to, or the
--       entry moved out of the queue), 4 the task existed already (the tick
--       is dropped, nothing created), 5 revision-fenced (extra: the fence),
--       6 stale (extra: the freshest fresh_as_of), 7 dropped at the fire
--       limit (extra: the count); 5 and 6 write nothing

local busy = {pending=true, scheduled=true, retry=true, active=true, aggregating=true}
local kheld = KEYS[1]
local v = redis.call('HMGET', kheld, 'task', 'prev', 'msg', 'rec_id', 'rec_data')
local task, prev = v[1], v[2]
if not task or task ~= ARGV[1] then return {0, ''} end

-- forget deletes the held tick: released, or dropped (counted in the
-- slot's dropped counter, with the dropped record when recorded).
local function forget(dropped, recorded)
  redis.call('DEL', kheld)
  redis.call('SREM', KEYS[2], kheld)
  if dropped then redis.call('INCR', KEYS[12]) end
  if recorded and ARGV[6] ~= '' then
    redis.call('XADD', KEYS[8], '*', 'id', ARGV[6], 'data', ARGV[7])
  end
end

local marker = redis.call('GET', KEYS[4])
if marker and string.match(marker, ' out$') then
  forget(true, true)
  return {3, ''}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fences = fence_check(KEYS[9], KEYS[10], KEYS[11], now_ms)
local code, extra = fences(ARGV[3], ARGV[4], ARGV[5])
if code == -3 then return {5, extra} end
if code == -4 then return {6, extra} end
if ARGV[2] == 'drop' then
  forget(true, true)
  return {3, ''}
end
local st = redis.call('HGET', KEYS[6], 'state')
if st and busy[st] then return {2, st} end
if redis.call('EXISTS', KEYS[5]) == 1 then
  forget(true, false)
  return {4, ''}
end
-- The fire limit, as fire.lua's: a count kept under another revision is
-- of another limit and counts afresh.
local limit, since, count = tonumber(ARGV[8]), ARGV[9], 0
if limit > 0 then
  local c = redis.call('GET', KEYS[13])
  if c then
    local sp = string.find(c, ' ', 1, true)
    if sp and string.sub(c, 1, sp - 1) == since then count = tonumber(string.sub(c, sp + 1)) or 0 end
  end
  if count >= limit then
    forget(true, true)
    return {7, string.format('%d', count)}
  end
end

local now_ns = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
redis.call('HSET', KEYS[5], 'msg', v[3], 'state', 'pending', 'pending_since', now_ns)
redis.call('LPUSH', KEYS[7], task)
redis.call('XADD', KEYS[8], '*', 'id', v[4], 'data', v[5])
if limit > 0 then
  redis.call('SET', KEYS[13], since .. ' ' .. string.format('%d', count + 1))
end
-- The watermark still names the previous task (the hold kept it, the
-- overlap skips since kept it too): it names the released one from now on,
-- so the entry's next tick sees this task busy.
local wm = redis.call('GET', KEYS[3])
if wm then
  local sp = string.find(wm, ' ', 1, true)
  if sp and string.sub(wm, sp + 1) == prev then
    redis.call('SET', KEYS[3], string.sub(wm, 1, sp - 1) .. ' ' .. task)
  end
end
forget(false, false)
return {1, 'pending'}
