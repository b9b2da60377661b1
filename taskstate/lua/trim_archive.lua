-- Runs the bounded archive trim alone (trim_archive_lib.lua, prepended),
-- with recover.lua's KEYS and ARGV layout (unused entries may be empty).
-- Reply 1 when members were left for another call, else 0.

return trim_archive()
