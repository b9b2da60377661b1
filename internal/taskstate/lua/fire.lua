-- Fires a chunk of fires that all go to one queue, in order. A fire later
-- in the chunk sees the effects of earlier ones, so consecutive ticks of one
-- entry (catch-up "all") may share a call.
--
-- The layout's names (K_*, FK_*, A_*, FA_*, FULL_*, LEAN_*, BA_*, KIND_*)
-- are prepended by taskstate/firelayout.go from the Go constants that lay
-- out each call, so Lua and Go read one definition.
--
-- KEYS  common: K_FENCE revision fence, K_FRESHNESS staleness fence,
--       K_OUTBOX, K_PENDING, K_SCHEDULED, K_GROUPS, K_FENCE_ID the fence's
--       config message id; then from K_FIRST_FIRE per fire:
--         full (FULL_KEYS): FK_WATERMARK, FK_MARKER handover marker,
--           FK_TASK, FK_UNIQUE asynq unique lock, FK_GROUP group zset,
--           FK_TRIGGER trigger request id, FK_HELD the entry's held tick,
--           FK_HELD_INDEX the slot's held index, FK_FIRES the entry's fires
--           counter "<revision> <count>"; unused ones are the task key (a
--           real key of the same slot: Redis Cluster rejects empty names)
--         lean (LEAN_KEYS): FK_WATERMARK, FK_MARKER, FK_TASK
--         bulk: a block of n of each: BK_WATERMARK, BK_MARKER, BK_TASK
-- ARGV  common: A_TASK_PREFIX asynq task-key prefix, A_FIRES n fires; then
--       from A_FIRST_FIRE per fire, offsets from its first argument:
--         head (full and lean): FA_KIND (KIND_TICK, KIND_TRIGGER,
--           KIND_BACKFILL, KIND_SKIP, or KIND_LEAN), FA_TICK ms,
--           FA_EXPECTED ms ("" = none), FA_CONFIG "<seq>" or
--           "<seq>:<config message id>", FA_FRESH fresh_as_of ms ("" = not
--           presented), FA_MAX_STALE ms
--         full (FULL_ARGS + 2n): FULL_PROCESS_AT ms (0 = now),
--           FULL_UNIQUE_TTL ms (0 = none), FULL_GROUP, FULL_MSG,
--           FULL_TASK_ID, FULL_OVERLAP (OVERLAP_SKIP, OVERLAP_BUFFER,
--           OVERLAP_CANCEL or "0" = allow), FULL_PREV_TASK,
--           FULL_TRIGGER_TTL ms, FULL_FIRED_REC, FULL_OVERLAP_REC,
--           FULL_DUPLICATE_REC (each an id/data pair), FULL_CANCEL_REC
--           (the cancelled record's id and its data's four parts,
--           cancelled_record), FULL_MAX_FIRES n
--           (0 = no limit), FULL_MAX_FIRES_SINCE revision, FULL_SKIPPED_COUNT n,
--           then n skipped id/data pairs
--         lean (LEAN_ARGS): LEAN_MSG, LEAN_TASK_ID, LEAN_FIRED_ID,
--           LEAN_FIRED_DATA
--       bulk: A_BULK = KIND_BULK, A_BULK_CONFIG, A_BULK_FRESH,
--         A_BULK_MAX_STALE (as the head's), A_BULK_RECORD_ID and
--         A_BULK_RECORDS (the fired records of every fire as one
--         multi-record: MULTI_TAG, then a frame per fire in order), then
--         from A_BULK_FIRST_FIRE per fire (BULK_ARGS): BA_TICK,
--         BA_EXPECTED, BA_MSG, BA_TASK_ID
-- Reply one value per fire: {code (6 = held, overlap buffer-one or
--       cancel-previous), watermark ms, watermark task id, extra,
--       task id, state}, extra being the fence, the moved revision, the
--       freshest ms, or for a fire or hold that replaced the previous task
--       (cancel-previous) "<its state> <its id>"; or a bare 1 for "fired,
--       pending" (lean and bulk).
--
-- Two short paths take fewer keys and arguments: lean (a plain tick) and
-- bulk (a whole chunk of plain ticks of different entries presenting the
-- same fences). TestFirePathsAgree holds them to the full path's results
-- and writes.
--
-- Order of checks: moved marker, revision fence, staleness fence, watermark
-- CAS, trigger request id, fire limit, then (before any write) task id
-- conflict, overlap, unique lock. A limited tick always takes the full
-- path: only it reads and moves the fires counter, so the counter moves in
-- the same atomic step as the task it counts, and only for a created task. Every check reads; writes come after the checks
-- passed, so a refusal writes nothing except raising the fences, which only
-- ever record what some replica truthfully presented.
--
-- The fences and why the staleness fence compares fires with each other
-- and not with Redis TIME: fences_lib.lua.

local t = redis.call('TIME')
local now_s = t[1]
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_ns = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
local task_prefix = ARGV[A_TASK_PREFIX]
local nfires = tonumber(ARGV[A_FIRES])
local busy = {pending=true, scheduled=true, retry=true, active=true, aggregating=true}
-- The fences are read once per call and written when raised.
local fences = fence_check(KEYS[K_FENCE], KEYS[K_FRESHNESS], KEYS[K_FENCE_ID], now_ms)

local function split(v) -- "<a> <b>": watermark "<ms> <task>", marker "<rev> <in|out>"
  if not v then return nil, nil end
  local sp = string.find(v, ' ', 1, true)
  if not sp then return v, '' end
  return string.sub(v, 1, sp - 1), string.sub(v, sp + 1)
end

-- res builds one fire's reply; a nil would cut a Lua array short.
local function res(code, wm, wmtask, extra, taskid, state)
  return {code, wm or '', wmtask or '', extra or '', taskid or '', state or ''}
end

local function append(from, n)
  for i = 0, n - 1 do
    redis.call('XADD', KEYS[K_OUTBOX], '*', 'id', ARGV[from + 2*i], 'data', ARGV[from + 2*i + 1])
  end
end

-- gate reads the fire's watermark and moved-marker (its keys from k) and
-- makes the checks every fire passes first: moved marker, then the fences
-- (its head's arguments from a). It returns the watermark and, when the
-- fire is refused, its reply.
local function gate(k, a)
  local v = redis.call('MGET', KEYS[k + FK_WATERMARK], KEYS[k + FK_MARKER])
  local wm, wmtask = split(v[1])
  local rev, dir = split(v[2])
  if dir == 'out' then return wm, wmtask, res(-2, wm, wmtask, rev) end
  local code, extra = fences(ARGV[a + FA_CONFIG], ARGV[a + FA_FRESH], ARGV[a + FA_MAX_STALE])
  if code then return wm, wmtask, res(code, wm, wmtask, extra) end
  return wm, wmtask, nil
end

-- mismatch is the watermark compare-and-set's refusal (nil when the
-- watermark is the expected one, "" = none).
local function mismatch(wm, wmtask, expected)
  if (expected == '' and wm) or (expected ~= '' and wm ~= expected) then
    return res(-1, wm, wmtask)
  end
  return nil
end

-- fire is the full path: one fire of any kind, keys from k, arguments
-- from a.
local function fire(k, a)
  local kind, tick, expected = ARGV[a + FA_KIND], ARGV[a + FA_TICK], ARGV[a + FA_EXPECTED]
  local kwm, ktask, ktrigger = KEYS[k + FK_WATERMARK], KEYS[k + FK_TASK], KEYS[k + FK_TRIGGER]
  local skipped = a + FULL_ARGS
  local nskipped = tonumber(ARGV[a + FULL_SKIPPED_COUNT])

  local wm, wmtask, refused = gate(k, a)
  if refused then return refused end

  if kind == KIND_TICK or kind == KIND_SKIP then
    refused = mismatch(wm, wmtask, expected)
    if refused then return refused end
    if kind == KIND_SKIP then
      -- A skip keeps the last fired task id for overlap checks.
      append(skipped, nskipped)
      redis.call('SET', kwm, tick .. ' ' .. (wmtask or ''))
      return res(5, tick, wmtask or '')
    end
  elseif kind == KIND_TRIGGER then
    local served = redis.call('GET', ktrigger)
    if served then return res(2, wm, wmtask, '', served) end
  end

  -- The fire limit: a count kept under another revision is of another
  -- limit and counts afresh. Replicas that fold the same config stream
  -- agree on the revision at every sequence, and one with an older
  -- configuration was refused by the revision fence above; a different
  -- revision at the same sequence only comes from an earlier stream epoch
  -- (INV-revision-fence), whose counts are not this stream's.
  local limit, since, count = tonumber(ARGV[a + FULL_MAX_FIRES]), ARGV[a + FULL_MAX_FIRES_SINCE], 0
  if kind == KIND_TICK and limit > 0 then
    local rev, n = split(redis.call('GET', KEYS[k + FK_FIRES]))
    if rev == since then count = tonumber(n) or 0 end
    if count >= limit then return res(-5, wm, wmtask, string.format('%d', count)) end
  end

  local id = ARGV[a + FULL_TASK_ID]
  -- Checks done; from here every outcome appends the gap's skipped records
  -- and its own record, moves a tick's watermark and remembers a trigger's
  -- request id.
  local code, rec, wm_task, taskid, state
  if redis.call('EXISTS', ktask) == 1 then
    code, wm_task, taskid = 2, id, id
  end

  local overlap = ARGV[a + FULL_OVERLAP]
  -- replaced: "<state> <task>" of the previous task overlap cancel-previous
  -- replaced (the reply's extra), with its cancelled record.
  local replaced, cancel_rec = '', nil
  if not code and (overlap == OVERLAP_SKIP or overlap == OVERLAP_BUFFER or overlap == OVERLAP_CANCEL) then
    local prev = ARGV[a + FULL_PREV_TASK]
    if prev == '' then prev = wmtask or '' end
    local kheld = KEYS[k + FK_HELD]
    local holding = overlap == OVERLAP_BUFFER or overlap == OVERLAP_CANCEL
    if holding and redis.call('EXISTS', kheld) == 1 then
      -- A tick is held already: this one is skipped whatever the previous
      -- task's state (the held one goes first, released by release_held).
      code, rec, wm_task, taskid = 4, a + FULL_OVERLAP_REC, prev, prev
    elseif prev ~= '' then
      local st = redis.call('HGET', task_prefix .. prev, 'state')
      if st and busy[st] and overlap == OVERLAP_CANCEL and st ~= 'active' then
        -- cancel-previous: a waiting task is deleted and this tick fires
        -- below, in this same step.
        delete_task(string.sub(task_prefix, 1, -3), prev)
        replaced = st .. ' ' .. prev
        cancel_rec = cancelled_record(ARGV[a + FULL_CANCEL_REC + 1], ARGV[a + FULL_CANCEL_REC + 2],
          ARGV[a + FULL_CANCEL_REC + 3], ARGV[a + FULL_CANCEL_REC + 4], prev, st)
      elseif st and busy[st] then
        if holding then
          -- Hold the tick: what firing it writes is kept, and the watermark
          -- moves past it (below) as for a fire, so no replica fires it
          -- again; the watermark keeps the busy task for later checks.
          redis.call('HSET', kheld, 'tick', tick, 'task', id, 'prev', prev,
            'msg', ARGV[a + FULL_MSG], 'rec_id', ARGV[a + FULL_FIRED_REC],
            'rec_data', ARGV[a + FULL_FIRED_REC + 1])
          redis.call('SADD', KEYS[k + FK_HELD_INDEX], kheld)
          code, wm_task, taskid, state = 6, prev, id, 'held'
          if overlap == OVERLAP_CANCEL then
            -- cancel-previous: the running task is cancelled by the caller
            -- (asynq's cancel channel); cancel_previous.lua releases the
            -- tick once it has stopped, or past held_at plus its timeout.
            redis.call('HSET', kheld, 'cancel', '1', 'held_at', string.format('%d', now_ms))
            replaced = st .. ' ' .. prev
            cancel_rec = cancelled_record(ARGV[a + FULL_CANCEL_REC + 1], ARGV[a + FULL_CANCEL_REC + 2],
              ARGV[a + FULL_CANCEL_REC + 3], ARGV[a + FULL_CANCEL_REC + 4], prev, st)
          end
        else
          code, rec, wm_task, taskid, state = 4, a + FULL_OVERLAP_REC, prev, prev, st
        end
      end
    end
  end

  if not code then
    local process_at, uttl = tonumber(ARGV[a + FULL_PROCESS_AT]), tonumber(ARGV[a + FULL_UNIQUE_TTL])
    local delayed = process_at > now_ms
    local kunique = KEYS[k + FK_UNIQUE]
    if uttl > 0 then
      local ttl_s
      if delayed then
        ttl_s = math.floor((process_at + uttl - now_ms) / 1000)
      else
        ttl_s = math.floor(uttl / 1000)
      end
      if ttl_s < 1 then ttl_s = 1 end
      if not redis.call('SET', kunique, id, 'NX', 'EX', string.format('%d', ttl_s)) then
        code, rec, wm_task, taskid = 3, a + FULL_DUPLICATE_REC, wmtask or '', redis.call('GET', kunique)
      end
    end
    if not code then
      local msg, group = ARGV[a + FULL_MSG], ARGV[a + FULL_GROUP]
      if delayed then
        -- asynq's Schedule(Unique): no pending_since, and no group field
        -- even when the message has a group (the forwarder then sends it
        -- to pending).
        state = 'scheduled'
        if uttl > 0 then
          redis.call('HSET', ktask, 'msg', msg, 'state', state, 'unique_key', kunique)
        else
          redis.call('HSET', ktask, 'msg', msg, 'state', state)
        end
        redis.call('ZADD', KEYS[K_SCHEDULED], string.format('%d', math.floor(process_at / 1000)), id)
      elseif group ~= '' then
        -- asynq's AddToGroup(Unique): the unique variant writes no unique_key.
        state = 'aggregating'
        redis.call('HSET', ktask, 'msg', msg, 'state', state, 'group', group)
        redis.call('ZADD', KEYS[k + FK_GROUP], now_s, id)
        redis.call('SADD', KEYS[K_GROUPS], group)
      else
        state = 'pending'
        if uttl > 0 then
          redis.call('HSET', ktask, 'msg', msg, 'state', state, 'pending_since', now_ns, 'unique_key', kunique)
        else
          redis.call('HSET', ktask, 'msg', msg, 'state', state, 'pending_since', now_ns)
        end
        redis.call('LPUSH', KEYS[K_PENDING], id)
      end
      code, rec, wm_task, taskid = 1, a + FULL_FIRED_REC, id, id
    end
  end

  append(skipped, nskipped)
  if cancel_rec then
    redis.call('XADD', KEYS[K_OUTBOX], '*', 'id', ARGV[a + FULL_CANCEL_REC], 'data', cancel_rec)
  end
  if rec then append(rec, 1) end
  if code == 1 and kind == KIND_TICK and limit > 0 then
    redis.call('SET', KEYS[k + FK_FIRES], since .. ' ' .. string.format('%d', count + 1))
  end
  if kind == KIND_TICK then
    redis.call('SET', kwm, tick .. ' ' .. wm_task)
    wm, wmtask = tick, wm_task
  elseif kind == KIND_TRIGGER then
    redis.call('SET', ktrigger, taskid or '', 'PX', ARGV[a + FULL_TRIGGER_TTL])
  end
  return res(code, wm, wmtask, replaced, taskid, state)
end

-- lean is fire() for a plain tick (KIND_LEAN): no overlap check, no unique
-- lock, no group, no delay, no skipped records; it answers 1 for "fired,
-- pending" instead of a row. Its checks (gate, mismatch) and writes are
-- fire()'s for such a tick, and the LPUSHes of consecutive lean fires are
-- made as one (flush, before any other fire and at the end: the list gets
-- the same ids in the same order, in the same atomic step), which saves
-- Redis CPU per fire (docs/benchmarks.md).
local pushed = {}
local function flush()
  if #pushed > 0 then
    redis.call('LPUSH', KEYS[K_PENDING], unpack(pushed))
    pushed = {}
  end
end

local function lean(k, a)
  local tick, expected = ARGV[a + FA_TICK], ARGV[a + FA_EXPECTED]
  local kwm, ktask = KEYS[k + FK_WATERMARK], KEYS[k + FK_TASK]
  local wm, wmtask, refused = gate(k, a)
  if refused then return refused end
  refused = mismatch(wm, wmtask, expected)
  if refused then return refused end

  local id = ARGV[a + LEAN_TASK_ID]
  if redis.call('EXISTS', ktask) == 1 then
    redis.call('SET', kwm, tick .. ' ' .. id)
    return res(2, tick, id, '', id)
  end
  redis.call('HSET', ktask, 'msg', ARGV[a + LEAN_MSG], 'state', 'pending', 'pending_since', now_ns)
  pushed[#pushed + 1] = id
  redis.call('XADD', KEYS[K_OUTBOX], '*', 'id', ARGV[a + LEAN_FIRED_ID], 'data', ARGV[a + LEAN_FIRED_DATA])
  redis.call('SET', kwm, tick .. ' ' .. id)
  return 1
end

-- holds reports whether the stored watermark value v ("<ms> <task>", or
-- false when absent) is at tick expected ("" = none): mismatch's test
-- without cutting v into new strings.
local function holds(v, expected)
  if expected == '' then return not v end
  if not v then return false end
  local n = #expected
  return string.sub(v, 1, n) == expected and (#v == n or string.byte(v, n + 1) == 32)
end

-- outcome returns the outbox record of the fires numbered in fired (in
-- order), cut out of recs, the multi-record of every fire of the call (one
-- frame per fire, "<len id> <len data> <id><data>": outbox.AppendFrame): a
-- fire's own record when it is the only one, else a multi-record of their
-- frames named after the first.
local function outcome(recs, fired)
  local parts, pos, j, first = {MULTI_TAG}, #MULTI_TAG + 1, 1, nil
  for i = 1, fired[#fired] do
    local sp1 = string.find(recs, ' ', pos, true)
    local sp2 = string.find(recs, ' ', sp1 + 1, true)
    local lid = tonumber(string.sub(recs, pos, sp1 - 1))
    local stop = sp2 + lid + tonumber(string.sub(recs, sp1 + 1, sp2 - 1))
    if fired[j] == i then
      if #fired == 1 then
        return string.sub(recs, sp2 + 1, sp2 + lid), string.sub(recs, sp2 + lid + 1, stop)
      end
      first = first or string.sub(recs, sp2 + 1, sp2 + lid)
      parts[#parts + 1] = string.sub(recs, pos, stop)
      j = j + 1
    end
    pos = stop + 1
  end
  return MULTI_ID_PREFIX .. first, table.concat(parts)
end

-- bulk fires a chunk of n plain ticks (KIND_BULK): lean's fires, each of a
-- different entry, all presenting the fences in A_BULK_CONFIG ..
-- A_BULK_MAX_STALE. The fires touch disjoint keys and present the same
-- fences (decided once, at the first fire that passes its marker, as lean
-- would), so reading every watermark and marker first and writing every
-- watermark last gives each fire lean's outcome and leaves the same state,
-- with two commands per fire instead of five: the fired records go into
-- the outbox as one multi-record of the fires that fired (docs/benchmarks.md).
local function bulk(n)
  local kwm = K_FIRST_FIRE + BK_WATERMARK * n - 1   -- fire i's watermark: KEYS[kwm + i]
  local kmark = K_FIRST_FIRE + BK_MARKER * n - 1
  local ktask = K_FIRST_FIRE + BK_TASK * n - 1
  -- One MGET of the watermark and marker blocks, in KEYS order.
  local v = redis.call('MGET', unpack(KEYS, K_FIRST_FIRE, K_FIRST_FIRE + 2 * n - 1))
  local vwm, vmark = kwm - K_FIRST_FIRE + 1, kmark - K_FIRST_FIRE + 1
  local out, marks, fired, gated, code, extra = {}, {}, {}, false, nil, nil
  for i = 1, n do
    local a = A_BULK_FIRST_FIRE + BULK_ARGS * (i - 1)
    local rev, dir = split(v[vmark + i])
    local cur = v[vwm + i]
    if dir == 'out' then
      local wm, wmtask = split(cur)
      out[i] = res(-2, wm, wmtask, rev)
    else
      if not gated then
        gated = true
        code, extra = fences(ARGV[A_BULK_CONFIG], ARGV[A_BULK_FRESH], ARGV[A_BULK_MAX_STALE])
      end
      if code then
        local wm, wmtask = split(cur)
        out[i] = res(code, wm, wmtask, extra)
      elseif not holds(cur, ARGV[a + BA_EXPECTED]) then
        local wm, wmtask = split(cur)
        out[i] = res(-1, wm, wmtask)
      else
        local tick, id, task = ARGV[a + BA_TICK], ARGV[a + BA_TASK_ID], KEYS[ktask + i]
        if redis.call('EXISTS', task) == 1 then
          out[i] = res(2, tick, id, '', id)
        else
          redis.call('HSET', task, 'msg', ARGV[a + BA_MSG], 'state', 'pending', 'pending_since', now_ns)
          pushed[#pushed + 1] = id
          fired[#fired + 1] = i
          out[i] = 1
        end
        marks[#marks + 1] = KEYS[kwm + i]
        marks[#marks + 1] = tick .. ' ' .. id
      end
    end
  end
  flush()
  if #fired > 0 then
    local id, recs = ARGV[A_BULK_RECORD_ID], ARGV[A_BULK_RECORDS]
    if #fired < n then id, recs = outcome(recs, fired) end
    redis.call('XADD', KEYS[K_OUTBOX], '*', 'id', id, 'data', recs)
  end
  if #marks > 0 then redis.call('MSET', unpack(marks)) end
  return out
end

if ARGV[A_BULK] == KIND_BULK then return bulk(nfires) end

local out = {}
local k, a = K_FIRST_FIRE, A_FIRST_FIRE
for i = 1, nfires do
  if ARGV[a + FA_KIND] == KIND_LEAN then
    out[i] = lean(k, a)
    a = a + LEAN_ARGS
    k = k + LEAN_KEYS
  else
    flush()
    out[i] = fire(k, a)
    a = a + FULL_ARGS + 2 * tonumber(ARGV[a + FULL_SKIPPED_COUNT])
    k = k + FULL_KEYS
  end
end
flush()
return out
