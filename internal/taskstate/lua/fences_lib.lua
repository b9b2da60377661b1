-- fence_check is the revision and staleness fences of one script call
-- (docs/design.md INV-revision-fence, INV-staleness-fence), shared by the
-- fire script and the release of held ticks, so a release is refused
-- exactly as a fire of the same replica would be. It reads the fences once
-- (keys kfence, kfresh and kfenceid of one slot; now_ms is Redis TIME) and
-- returns check(seq, fresh, maxstale): for a call presenting config
-- sequence seq ("<seq>" or "<seq>:<config message id>"), freshness fresh
-- ("" = not presented) and staleness bound maxstale, the refusal's code (-3
-- revision-fenced, -4 stale) and extra (the fence, or the freshest), or nil
-- after raising each fence it passes. Calling it again with the same
-- arguments gives the same answer and writes nothing.
--
-- KEYS  none of its own: the including script passes its slot's fence keys
-- ARGV  none of its own: likewise the fences its call presents
--
-- Why the staleness fence compares calls with each other and not with Redis
-- TIME: fresh_as_of is when a replica's projection last heard the config
-- stream. The slot keeps the highest fresh_as_of any call has presented. A
-- replica that lags it by more than max staleness either lost the stream
-- while another replica still hears it, or stalled (GC, VM pause) while
-- others moved on — in both cases a config change may have been published
-- that it has not seen, so it must not fire. When nobody hears NATS, nobody
-- can publish a change either (INV-staleness-fence in docs/design.md): every
-- replica's fresh_as_of stops at about the same instant, none lags the
-- maximum, and all keep firing on the last known configuration. A
-- comparison with Redis TIME would instead stop every replica during a NATS
-- outage, which is exactly what INV-staleness-fence forbids. Redis TIME only
-- bounds what is believed: a freshness more than 2 s ahead of it is capped
-- there (presented) or ignored (stored), so a replica whose clock runs fast
-- cannot make every other replica's fires stale.
local function fence_check(kfence, kfresh, kfenceid, now_ms)
  local fence = redis.call('GET', kfence)
  local freshest = redis.call('GET', kfresh)
  -- fence_ref is "<seq>:<id>" when the fence id key names the fence's
  -- message, else just the fence (an earlier build raised it, or no call
  -- presented an id).
  local fence_ref = fence
  if fence then
    local fid = redis.call('GET', kfenceid)
    if fid and string.match(fid, '^(%d+)') == fence then fence_ref = fid end
  end
  local fresh_cap = now_ms + 2000
  if freshest and tonumber(freshest) > fresh_cap then freshest = nil end

  return function(seq, fresh, maxstale)
    local ref = seq
    seq = string.match(ref, '^(%d+)')
    if fence and tonumber(seq) < tonumber(fence) then return -3, fence_ref end
    if not fence or tonumber(seq) > tonumber(fence) then
      fence, fence_ref = seq, seq
      redis.call('SET', kfence, seq)
    end
    -- The fence's message id, when this call knows it and it is not the
    -- one stored (none, or another stream's message at the same sequence:
    -- the replica read its message from the stream it follows).
    if ref ~= seq and fence_ref ~= ref and tonumber(seq) == tonumber(fence) then
      fence_ref = ref
      redis.call('SET', kfenceid, ref)
    end
    if fresh ~= '' then
      if tonumber(fresh) > fresh_cap then fresh = string.format('%d', fresh_cap) end
      maxstale = tonumber(maxstale)
      if freshest and maxstale > 0 and tonumber(fresh) < tonumber(freshest) - maxstale then
        return -4, freshest
      end
      if not freshest or tonumber(fresh) > tonumber(freshest) then
        freshest = fresh
        redis.call('SET', kfresh, fresh)
      end
    end
    return nil
  end
end
