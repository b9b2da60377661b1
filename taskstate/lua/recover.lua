-- Applies one chunk of recovery decisions. Per decision it re-checks the
-- lease (still present, score <= cutoff), the message (sha1 unchanged) and
-- the state (active); then it writes the outbox record, replaces the task's
-- active-list element with the tombstone (at the hinted tail depth when
-- LINDEX confirms it, else where LPOS finds it from the tail), and does
-- asynq's Retry or Archive. After the loop: one LREM of the tombstones from
-- the tail, the counters (asynq's daily keys, EXPIREAT on creation, totals
-- reset at MaxInt64), and a bounded archive trim (trim_archive_lib.lua,
-- prepended).
--
-- KEYS  1 lease              6 failed:<day>
--       2 active             7 processed
--       3 retry              8 failed
--       4 archived           9 task-key prefix
--       5 processed:<day>   10 outbox
-- ARGV  1 cutoff (unix s)    5 archive max size
--       2 now (unix s)       6 trim budget
--       3 stats expire-at    7 tombstone
--       4 archive age cutoff 8 MaxInt64
--       then per decision 9 values: id, sha1, action (r|a), retry-at,
--       is-failure (1|0), new msg, event id, record data, tail-depth hint
--       (0 = none)
-- Reply per decision: status, stream id, removed-from-list (0|1); then 1
--       when the archive trim ran out of budget.

local cutoff = tonumber(ARGV[1])
local now = ARGV[2]
local tomb = ARGV[7]
local res = {}
local tombs, counted, archived = 0, 0, 0
local llen = redis.call('LLEN', KEYS[2])
local mind, maxd = llen + 1, 0
local moved, unlease, toretry, toarchive = {}, {}, {}, {}
for b = 9, #ARGV, 9 do
  local id = ARGV[b]
  local status, xid, removed = 0, '', 0
  local score = false
  if not moved[id] then
    score = redis.call('ZSCORE', KEYS[1], id)
  end
  local tkey = KEYS[9] .. id
  if not score then
    status = 3
  elseif tonumber(score) > cutoff then
    status = 4
  else
    local h = redis.call('HMGET', tkey, 'msg', 'state')
    if not h[1] or redis.sha1hex(h[1]) ~= ARGV[b+1] then
      status = 5
    elseif h[2] ~= 'active' then
      status = 6
    else
      moved[id] = true
      xid = redis.call('XADD', KEYS[10], '*', 'id', ARGV[b+6], 'data', ARGV[b+7])
      local hint = tonumber(ARGV[b+8])
      local depth = false
      if hint > 0 and redis.call('LINDEX', KEYS[2], -hint) == id then
        depth = hint
      else
        local idx = redis.call('LPOS', KEYS[2], id, 'RANK', -1)
        if idx then depth = llen - idx end
      end
      if depth then
        redis.call('LSET', KEYS[2], -depth, tomb)
        tombs = tombs + 1
        removed = 1
        if depth < mind then mind = depth end
        if depth > maxd then maxd = depth end
      end
      unlease[#unlease+1] = id
      if ARGV[b+2] == 'r' then
        toretry[#toretry+1] = ARGV[b+3]
        toretry[#toretry+1] = id
        redis.call('HSET', tkey, 'msg', ARGV[b+5], 'state', 'retry')
        if ARGV[b+4] == '1' then counted = counted + 1 end
        status = 1
      else
        toarchive[#toarchive+1] = now
        toarchive[#toarchive+1] = id
        redis.call('HSET', tkey, 'msg', ARGV[b+5], 'state', 'archived')
        counted = counted + 1
        archived = archived + 1
        status = 2
      end
    end
  end
  res[#res+1] = status
  res[#res+1] = xid
  res[#res+1] = removed
end
-- One command per container instead of one per task, in slices that stay
-- far below Lua's unpack limit.
local function each(cmd, key, args)
  for i = 1, #args, 500 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 499, #args)))
  end
end
each('ZREM', KEYS[1], unlease)
each('ZADD', KEYS[3], toretry)
each('ZADD', KEYS[4], toarchive)
-- Remove the tombstones scanning from the nearer end: from the tail the
-- scan reaches depth maxd, from the head it reaches depth mind.
if tombs > 0 then
  if maxd <= llen - mind + 1 then
    redis.call('LREM', KEYS[2], -tombs, tomb)
  else
    redis.call('LREM', KEYS[2], tombs, tomb)
  end
end
if counted > 0 then
  for _, day in ipairs({KEYS[5], KEYS[6]}) do
    if redis.call('INCRBY', day, counted) == counted then
      redis.call('EXPIREAT', day, ARGV[3])
    end
  end
  local maxint = tonumber(ARGV[8])
  local p = tonumber(redis.call('GET', KEYS[7]) or '0') or 0
  local f = tonumber(redis.call('GET', KEYS[8]) or '0') or 0
  if p < maxint - counted - 1024 and f < maxint - counted - 1024 then
    redis.call('INCRBY', KEYS[7], counted)
    redis.call('INCRBY', KEYS[8], counted)
  else
    -- Near MaxInt64: asynq's rule task by task, the processed total
    -- deciding for both totals.
    for _ = 1, counted do
      if tonumber(redis.call('GET', KEYS[7])) == maxint then
        redis.call('SET', KEYS[7], 1)
        redis.call('SET', KEYS[8], 1)
      else
        redis.call('INCR', KEYS[7])
        redis.call('INCR', KEYS[8])
      end
    end
  end
end
local more = 0
if archived > 0 then
  more = trim_archive()
end
res[#res+1] = more
return res
