-- Applies one chunk of recovery decisions. Per decision it re-checks the
-- lease (still present, score <= cutoff), the message (sha1 unchanged) and
-- the state (active); then it adds the task's event to the outbox, takes
-- the task out of the active list, and does asynq's Retry or Archive.
-- After the loop: the list rewritten, the counters (asynq's daily keys,
-- EXPIREAT on creation, totals reset at MaxInt64), and a bounded archive
-- trim (trim_archive_lib.lua, prepended).
--
-- Taking tasks out of the list: when the caller names a tail window (a
-- chunk cut from the list's tail: its deepest task's depth), the script
-- reads those elements once and takes them all off the tail with one
-- LTRIM; the chunk's tasks are dropped and the others (live tasks the
-- stretch held) go back at the head, in their order, with one LPUSH. Put
-- back at the tail they would pile up there and lengthen every later
-- window; asynq reads nothing from the list's order. A task outside the
-- window is overwritten with the tombstone where it sits (at the hinted
-- tail depth when LINDEX confirms it, else where LPOS finds it from the
-- tail), and all tombstones go with one LREM counted from the nearer end.
--
-- Outbox records: the events of the moved tasks go into batch records
-- (the batch tag, then a JSON array of the events; its id is
-- events.BatchID: "batch:<n>:<first event's id>") of at most the batch
-- size in bytes; an event alone in its batch is a record of its own, as
-- when the batch size is 0.
--
-- KEYS  1 lease              6 failed:<day>
--       2 active             7 processed
--       3 retry              8 failed
--       4 archived           9 task-key prefix
--       5 processed:<day>   10 outbox
-- ARGV  1 cutoff (unix s)    7 tombstone
--       2 now (unix s)       8 MaxInt64
--       3 stats expire-at    9 tail window (elements; 0 = none)
--       4 archive age cutoff 10 batch size (bytes; 0 = a record per event)
--       5 archive max size  11 batch tag
--       6 trim budget
--       then per decision 9 values: id, sha1, action (r|a), retry-at,
--       is-failure (1|0), new msg, event id, event (JSON object),
--       tail-depth hint (0 = none)
-- Reply per decision: status, stream id of the record holding its event,
--       removed from the list (0 no, 1 by its tombstone, 2 with the
--       window; 3 and 4 the same after LPOS searched the list for it
--       because its hint was stale); then how many elements the window took off
--       the tail (0 = none), and 1 when the archive trim ran out of budget.

local cutoff = tonumber(ARGV[1])
local now = ARGV[2]
local tomb = ARGV[7]
local res = {}
local tombs, counted, archived = 0, 0, 0
local llen = redis.call('LLEN', KEYS[2])
local mind, maxd = llen + 1, 0
-- win holds the tail window, deepest first (win[i] is at tail depth
-- #win - i + 1; false once its task is taken out); winpos finds an id's
-- element nearest the tail.
local win, winpos, inwin = {}, {}, 0
if tonumber(ARGV[9]) > 0 then
  win = redis.call('LRANGE', KEYS[2], -tonumber(ARGV[9]), -1)
  for i = #win, 1, -1 do
    if winpos[win[i]] == nil then winpos[win[i]] = i end
  end
end
local moved, unlease, toretry, toarchive = {}, {}, {}, {}
-- The batch being filled: its events, their bytes, the first one's id,
-- and where the reply holds the stream id of each of its tasks.
local batchmax, tag = tonumber(ARGV[10]), ARGV[11]
local batch, batchbytes, batchfirst, batchslots = {}, 0, '', {}
local function flush()
  if #batch == 0 then return end
  local xid
  if #batch == 1 then
    xid = redis.call('XADD', KEYS[10], '*', 'id', batchfirst, 'data', batch[1])
  else
    xid = redis.call('XADD', KEYS[10], '*', 'id', 'batch:' .. #batch .. ':' .. batchfirst,
      'data', tag .. '[' .. table.concat(batch, ',') .. ']')
  end
  for _, k in ipairs(batchslots) do res[k] = xid end
  batch, batchbytes, batchfirst, batchslots = {}, 0, '', {}
end
for b = 12, #ARGV, 9 do
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
      local ev = ARGV[b+7]
      if #batch > 0 and batchbytes + #ev + 1 > batchmax then flush() end
      if #batch == 0 then batchfirst = ARGV[b+6] end
      batch[#batch+1] = ev
      batchbytes = batchbytes + #ev + 1
      batchslots[#batchslots+1] = #res + 2
      local hint = tonumber(ARGV[b+8])
      local depth, searched = false, false
      if winpos[id] then
        depth = #win - winpos[id] + 1
      elseif hint > 0 and redis.call('LINDEX', KEYS[2], -hint) == id then
        depth = hint
      else
        local idx = redis.call('LPOS', KEYS[2], id, 'RANK', -1)
        if idx then depth, searched = llen - idx, hint > 0 end
      end
      if depth and depth <= #win then
        win[#win - depth + 1] = false
        winpos[id] = nil
        inwin = inwin + 1
        removed = searched and 4 or 2
      elseif depth then
        redis.call('LSET', KEYS[2], -depth, tomb)
        tombs = tombs + 1
        removed = searched and 3 or 1
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
flush()
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
local taken = 0
if inwin > 0 then
  -- Oldest first, so that the newest ends up at the head.
  local kept = {}
  for i = #win, 1, -1 do
    if win[i] then kept[#kept+1] = win[i] end
  end
  redis.call('LTRIM', KEYS[2], 0, -(#win + 1))
  each('LPUSH', KEYS[2], kept)
  taken = #win
end
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
res[#res+1] = taken
res[#res+1] = more
return res
