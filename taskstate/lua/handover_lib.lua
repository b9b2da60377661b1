-- Shared by handover_close.lua and handover_seed.lua (prepended to each).
--
-- KEYS  1 handover marker ("<revision> <in|out>")
--       2 watermark
--       3 revision fence
--       4 marker id ("<revision>:<config message id>", OwnKeys.HandoverID)
-- ARGV  1 revision

-- raise_fence raises the revision fence to the revision.
local function raise_fence()
  local fence = redis.call('GET', KEYS[3])
  if not fence or tonumber(fence) < tonumber(ARGV[1]) then redis.call('SET', KEYS[3], ARGV[1]) end
end

-- store_id stores "<revision>:<id>" beside the marker when the marker is now
-- `marker` and the caller knows the id of the config message at the
-- revision (id, "" = unknown): the marker keeps the format earlier builds
-- read, the id sits beside it.
local function store_id(marker, id)
  if id ~= '' and redis.call('GET', KEYS[1]) == marker then
    redis.call('SET', KEYS[4], ARGV[1] .. ':' .. id)
  end
end

