package taskstate

import (
	"embed"
	"strings"

	"github.com/cronstream/cronstream/internal/redisscript"
)

// The package's Lua scripts, one file each under lua/, each headed by its
// KEYS and ARGV. Every call goes through internal/redisscript (EVALSHA,
// EVAL when the server does not know the script yet), single or pipelined.
var (
	// fireScript fires a chunk of fires into one queue (FireBatch).
	fireScript = luaScript(fireLayoutLua, "fences_lib.lua", "cancel_lib.lua", "fire.lua")

	// closeForHandoverScript and seedWatermarkScript are the two steps of
	// a queue handover (CloseForHandover, SeedWatermark).
	closeForHandoverScript = luaScript("", "handover_lib.lua", "handover_close.lua")
	seedWatermarkScript    = luaScript("", "handover_lib.lua", "handover_seed.lua")
	// seedFiresScript raises an entry's fires counter (SeedFireCount).
	seedFiresScript = luaScript("", "fires_seed.lua")
	// clearSeqScript clears a fence or marker of an earlier config stream.
	clearSeqScript = luaScript("", "clear_seq.lua")

	// recoverScript applies a chunk of recovery decisions (RecoverBatch);
	// trimArchiveScript runs its bounded archive trim alone.
	recoverScript        = luaScript("", "trim_archive_lib.lua", "recover.lua")
	trimArchiveScript    = luaScript("", "trim_archive_lib.lua", "trim_archive.lua")
	leaseMessagesScript  = luaScript("", "lease_messages.lua")
	recoverOrphansScript = luaScript("", "recover_orphans.lua")
	reclaimScript        = luaScript("", "reclaim.lua")

	acquireOutboxScript = luaScript("", "outbox_acquire.lua")
	releaseOutboxScript = luaScript("", "outbox_release.lua")
	renewOutboxScript   = luaScript("", "outbox_renew.lua")
	ackOutboxScript     = luaScript("", "outbox_ack.lua")

	deleteUnchangedScript = luaScript("", "delete_unchanged.lua")

	// The shard leases of ownership (AcquireShardLeases,
	// RenewShardLeases, ReleaseShardLeases).
	acquireShardLeaseScript = luaScript("", "shard_lease_lib.lua", "shard_lease_acquire.lua")
	renewShardLeaseScript   = luaScript("", "shard_lease_lib.lua", "shard_lease_renew.lua")
	releaseShardLeaseScript = luaScript("", "shard_lease_lib.lua", "shard_lease_release.lua")

	// proposeRestoreScript and clearRestoreScript keep the proposals
	// that seed lost watermarks (ProposeRestore, ClearRestore).
	proposeRestoreScript = luaScript("", "restore_propose.lua")
	clearRestoreScript   = luaScript("", "restore_clear.lua")

	// releaseHeldScript fires or drops a held tick (ReleaseHeld).
	releaseHeldScript = luaScript("", "fences_lib.lua", "release_held.lua")
	// releaseCancelScript fires or drops a tick held by overlap
	// cancel-previous (ReleaseCancel), fenced as releaseHeldScript is.
	releaseCancelScript = luaScript(cancelLayoutLua, "fences_lib.lua", "cancel_lib.lua", "cancel_previous.lua")

	writeSchedulerEntriesScript = luaScript("", "scheduler_entries.lua")
	recordSchedulerEventScript  = luaScript("", "scheduler_event.lua")
	// takeHistoryScript reads and deletes an entry's enqueue history in
	// one step (HistoryCapture).
	takeHistoryScript = luaScript("", "history_take.lua")
)

//go:embed lua/*.lua
var luaFiles embed.FS

// luaScript is the script made of prelude and the named files of lua/, in
// order (shared functions first). The files are embedded at build time, so
// a wrong name fails every test of the package at start-up.
func luaScript(prelude string, names ...string) *redisscript.Script {
	var b strings.Builder
	b.WriteString(prelude)
	for _, n := range names {
		src, err := luaFiles.ReadFile("lua/" + n)
		if err != nil {
			panic("taskstate: embedded script " + n + ": " + err.Error())
		}
		b.Write(src)
	}
	return redisscript.New(b.String())
}
