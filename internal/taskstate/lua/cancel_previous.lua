-- Releases (or drops) one entry's tick held by overlap cancel-previous, in
-- one atomic step: a compare-and-set on the held tick's task id, so that of
-- the replicas checking the slot at once exactly one fires it. The held
-- tick waits for the previous task, whose cancellation was published, to
-- stop running. Once it has: a task that landed back in a waiting state
-- (asynq moves a cancelled task to retry) is deleted, and the held tick
-- fires; one that completed or was archived is left alone. A task still
-- active past the give-up time (its timeout or deadline, counted from when
-- the tick was held: its worker is gone or hung) no longer holds the tick.
-- As release_held.lua, the release presents the releasing replica's fences
-- and is refused by them as a fire would be (fences_lib.lua), so a replica
-- whose projection lags cannot fire (or drop) a held tick of an entry a
-- newer configuration paused, removed or moved off cancel-previous.
--
-- KEYS  as release_held.lua: 1 the entry's held tick, 2 the slot's held
--       index, 3 the entry's watermark, 4 its handover marker, 5 the held
--       task's hash, 6 the previous task's hash, 7 asynq's pending list,
--       8 the slot's outbox, 9 the revision fence, 10 the staleness fence,
--       11 the fence's config message id, 12 the slot's count of dropped
--       held ticks (OwnKeys.HeldDrops)
-- ARGV  1 the held task id the caller read, 2 "drop" to drop the tick
--       instead of firing it, 3 the give-up time, unix ms ("0" = none),
--       4 asynq's key prefix of the queue ("asynq:{<queue>}:"), 5 config
--       "<seq>" or "<seq>:<id>", 6 fresh_as_of ms ("" = not presented),
--       7 max staleness ms (as a fire's head), 8 and 9 the dropped
--       record's id and data (a skipped event), appended when the tick is
--       dropped ("" = none)
-- Reply {code, extra, deleted}: 1 released (fired, pending; extra is
--       "pending"), 2 waiting (the previous task is still active; extra is
--       "active"), 0 gone (no such held tick), 3 dropped (asked to, or the
--       entry moved out of the queue), 4 the task existed already (the
--       tick is dropped, nothing created), 5 released past the give-up
--       time while the previous task was still active, 6 revision-fenced
--       (extra: the fence), 7 stale (extra: the freshest fresh_as_of); 6
--       and 7 write nothing. deleted is the state the previous task was
--       deleted from ("" = not deleted).

local busy = {pending=true, scheduled=true, retry=true, aggregating=true}
local kheld = KEYS[1]
local v = redis.call('HMGET', kheld, 'task', 'prev', 'msg', 'rec_id', 'rec_data', 'cancel')
local task, prev = v[1], v[2]
if not task or task ~= ARGV[1] or v[6] ~= '1' then return {0, '', ''} end

-- forget deletes the held tick: released, or dropped (counted in the
-- slot's dropped counter, with the dropped record when recorded), as
-- release_held.lua's.
local function forget(dropped, recorded)
  redis.call('DEL', kheld)
  redis.call('SREM', KEYS[2], kheld)
  if dropped then redis.call('INCR', KEYS[12]) end
  if recorded and ARGV[8] ~= '' then
    redis.call('XADD', KEYS[8], '*', 'id', ARGV[8], 'data', ARGV[9])
  end
end

local marker = redis.call('GET', KEYS[4])
if marker and string.match(marker, ' out$') then
  forget(true, true)
  return {3, '', ''}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fences = fence_check(KEYS[9], KEYS[10], KEYS[11], now_ms)
local fcode, fextra = fences(ARGV[5], ARGV[6], ARGV[7])
if fcode == -3 then return {6, fextra, ''} end
if fcode == -4 then return {7, fextra, ''} end
if ARGV[2] == 'drop' then
  forget(true, true)
  return {3, '', ''}
end

local code, deleted = 1, ''
local st = redis.call('HGET', KEYS[6], 'state')
if st == 'active' then
  local give_up = tonumber(ARGV[3]) or 0
  if give_up <= 0 or now_ms < give_up then return {2, st, ''} end
  code = 5
elseif st and busy[st] then
  deleted = delete_task(ARGV[4], prev) or ''
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  forget(true, false)
  return {4, '', deleted}
end

local now_ns = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
redis.call('HSET', KEYS[5], 'msg', v[3], 'state', 'pending', 'pending_since', now_ns)
redis.call('LPUSH', KEYS[7], task)
redis.call('XADD', KEYS[8], '*', 'id', v[4], 'data', v[5])
-- As release_held.lua: the watermark names the released task from now on.
local wm = redis.call('GET', KEYS[3])
if wm then
  local sp = string.find(wm, ' ', 1, true)
  if sp and string.sub(wm, sp + 1) == prev then
    redis.call('SET', KEYS[3], string.sub(wm, 1, sp - 1) .. ' ' .. task)
  end
end
forget(false, false)
return {code, 'pending', deleted}
