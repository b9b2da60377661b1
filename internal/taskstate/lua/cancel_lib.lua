-- Shared by fire.lua and cancel_previous.lua (overlap cancel-previous).
--
-- KEYS  none of its own: the including script passes its queue's asynq key
--       prefix (delete_task's qprefix)
-- ARGV  none of its own: likewise the task and record parts it works on

-- delete_task deletes the task id of the queue whose asynq key prefix is
-- qprefix ("asynq:{<queue>}:") as asynq's Inspector.DeleteTask does: out of
-- the list or sorted set of its state (and its group's set, dropping the
-- group from the groups set when it empties), its unique lock when the lock
-- is still its own, then its hash. An active task is left alone (asynq
-- cancels those through its workers). It returns the state the task was
-- in, or nil when there was no such task or it is active.
local function delete_task(qprefix, id)
  local tkey = qprefix .. 't:' .. id
  local v = redis.call('HMGET', tkey, 'state', 'group', 'unique_key')
  local st, group, ukey = v[1], v[2], v[3]
  if not st or st == 'active' then return nil end
  if st == 'pending' then
    redis.call('LREM', qprefix .. 'pending', 0, id)
  elseif st == 'aggregating' then
    local gkey = qprefix .. 'g:' .. (group or '')
    redis.call('ZREM', gkey, id)
    if redis.call('ZCARD', gkey) == 0 then redis.call('SREM', qprefix .. 'groups', group or '') end
  else
    redis.call('ZREM', qprefix .. st, id)
  end
  if ukey and ukey ~= '' and redis.call('GET', ukey) == id then redis.call('DEL', ukey) end
  redis.call('DEL', tkey)
  return st
end

-- cancelled_record completes the cancelled event's data, kept as the four
-- parts around its task id, state and action (CancelRecord in Go), with
-- the replaced task's id and state.
local function cancelled_record(p1, p2, p3, p4, id, st)
  local action = CANCEL_DELETED
  if st == 'active' then action = CANCEL_REQUESTED end
  return p1 .. cjson.encode(id) .. p2 .. cjson.encode(st) .. p3 .. cjson.encode(action) .. p4
end
