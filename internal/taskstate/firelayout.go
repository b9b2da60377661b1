package taskstate

import (
	"fmt"
	"strings"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/outbox"
)

// The fire script's KEYS and ARGV layouts (lua/fire.lua), named once: Go
// lays out each call by these constants, and the script reads the same
// names from a prelude made of them (fireLayoutLua), so the two sides cannot
// disagree. KEYS and ARGV positions are Lua's (from 1); per-fire fields are
// offsets from the fire's first key or argument.

// KEYS common to every call.
const (
	keyFence     = 1 + iota // revision fence
	keyFreshness            // staleness fence
	keyOutbox               // the slot's outbox stream
	keyPending              // asynq's pending list
	keyScheduled            // asynq's scheduled zset
	keyGroups               // asynq's groups set
	keyFenceID              // the fence's config message id
	keyFirstFire            // where the fires' keys begin
)

// A fire's keys on the full and lean paths. The lean path takes the first
// three.
const (
	fireKeyWatermark = iota
	fireKeyMarker    // handover marker
	fireKeyTask      // the task's hash
	fireKeyUnique    // asynq's unique lock (unused: the task key)
	fireKeyGroup     // the group zset (unused: the task key)
	fireKeyTrigger   // the trigger's request id (unused: the task key)
	fireKeyHeld      // the entry's held tick (unused: the task key)
	fireKeyHeldIndex // the slot's held-tick index (unused: the task key)
	fireKeyFires     // the entry's fires counter (unused: the task key)
	fullKeys         // keys per fire, full path
	leanKeys         = fireKeyTask + 1
)

// The bulk path's keys: from keyFirstFire, a block of n of each kind, in
// this order (the watermarks and markers first: one MGET reads both).
const (
	bulkBlockWatermark = iota
	bulkBlockMarker
	bulkBlockTask
)

// ARGV common to every call.
const (
	argTaskPrefix = 1 + iota // asynq's task-key prefix of the queue
	argFires                 // number of fires
	argFirstFire             // where the fires' arguments begin (full, lean)
)

// A fire's arguments, full and lean path alike up to fireArgMaxStale.
const (
	fireArgKind      = iota // kindTick … kindLean
	fireArgTick             // unix ms
	fireArgExpected         // unix ms, "" = none
	fireArgConfig           // "<seq>" or "<seq>:<config message id>"
	fireArgFresh            // fresh_as_of unix ms, "" = not presented
	fireArgMaxStale         // ms
	fireArgHeadCount        // the shared head's length
)

// The full path's arguments after the shared head.
const (
	fullArgProcessAt     = fireArgHeadCount + iota // unix ms, 0 = now
	fullArgUniqueTTL                               // ms, 0 = none
	fullArgGroup                                   // "" = none
	fullArgMsg                                     // encoded TaskMessage
	fullArgTaskID                                  //
	fullArgOverlap                                 // overlapAllow, overlapSkip or overlapBuffer
	fullArgPrevTask                                // "" = the watermark's task
	fullArgTriggerTTL                              // ms
	fullArgFiredID                                 // fired record: event id
	fullArgFiredData                               // and data
	fullArgOverlapID                               // overlap record
	fullArgOverlapData                             //
	fullArgDuplicateID                             // duplicate record
	fullArgDuplicateData                           //
	fullArgCancelID                                // cancelled record (cancel-previous): event id,
	fullArgCancelData1                             // then its data's four parts (CancelRecord)
	fullArgCancelData2                             //
	fullArgCancelData3                             //
	fullArgCancelData4                             //
	fullArgMaxFires                                // 0 = no limit
	fullArgMaxFiresSince                           // revision the count is keyed by
	fullArgSkippedCount                            // n, then n id/data pairs
	fullArgs                                       // the fixed part's length
)

// The lean path's arguments after the shared head.
const (
	leanArgMsg       = fireArgHeadCount + iota // encoded TaskMessage
	leanArgTaskID                              //
	leanArgFiredID                             // fired record: event id
	leanArgFiredData                           // and data
	leanArgs                                   // arguments per fire
)

// The bulk path: ARGV[argBulk] is kindBulk, then the fences every fire
// presents, the fired records of all its fires as one multi-record, then
// bulkArgs arguments per fire.
const (
	argBulk          = argFirstFire + iota // kindBulk
	argBulkConfig                          // as fireArgConfig
	argBulkFresh                           // as fireArgFresh
	argBulkMaxStale                        // as fireArgMaxStale
	argBulkRecordID                        // the multi-record's id (outbox.MultiRecordID)
	argBulkRecords                         // and data: a frame per fire, in order
	argBulkFirstFire                       // where the fires' arguments begin
)

const (
	bulkArgTick     = iota // unix ms
	bulkArgExpected        // unix ms, "" = none
	bulkArgMsg             // encoded TaskMessage
	bulkArgTaskID          //
	bulkArgs               // arguments per fire
)

// Overlap policies as the script reads them (fullArgOverlap).
const (
	overlapAllow  = "0"
	overlapSkip   = "1" // skip while the previous task is busy
	overlapBuffer = "2" // hold one tick while it is busy, skip the rest
	overlapCancel = "3" // delete it when waiting, else cancel it and hold the tick
)

// Fire kinds as the script reads them (fireArgKind, argBulk).
const (
	kindTick     = "t"
	kindTrigger  = "r"
	kindBackfill = "b"
	kindSkip     = "s"
	kindLean     = "T" // a plain tick on the lean path
	kindBulk     = "B" // a whole call on the bulk path
)

// fireLayoutLua is the prelude fire.lua reads its layout from.
var fireLayoutLua = luaConstants([]luaConstant{
	{"K_FENCE", keyFence}, {"K_FRESHNESS", keyFreshness}, {"K_OUTBOX", keyOutbox},
	{"K_PENDING", keyPending}, {"K_SCHEDULED", keyScheduled}, {"K_GROUPS", keyGroups},
	{"K_FENCE_ID", keyFenceID}, {"K_FIRST_FIRE", keyFirstFire},
	{"FK_WATERMARK", fireKeyWatermark}, {"FK_MARKER", fireKeyMarker}, {"FK_TASK", fireKeyTask},
	{"FK_UNIQUE", fireKeyUnique}, {"FK_GROUP", fireKeyGroup}, {"FK_TRIGGER", fireKeyTrigger},
	{"FK_HELD", fireKeyHeld}, {"FK_HELD_INDEX", fireKeyHeldIndex}, {"FK_FIRES", fireKeyFires},
	{"FULL_KEYS", fullKeys}, {"LEAN_KEYS", leanKeys},
	{"BK_WATERMARK", bulkBlockWatermark}, {"BK_MARKER", bulkBlockMarker}, {"BK_TASK", bulkBlockTask},
	{"A_TASK_PREFIX", argTaskPrefix}, {"A_FIRES", argFires}, {"A_FIRST_FIRE", argFirstFire},
	{"FA_KIND", fireArgKind}, {"FA_TICK", fireArgTick}, {"FA_EXPECTED", fireArgExpected},
	{"FA_CONFIG", fireArgConfig}, {"FA_FRESH", fireArgFresh}, {"FA_MAX_STALE", fireArgMaxStale},
	{"FULL_PROCESS_AT", fullArgProcessAt}, {"FULL_UNIQUE_TTL", fullArgUniqueTTL}, {"FULL_GROUP", fullArgGroup},
	{"FULL_MSG", fullArgMsg}, {"FULL_TASK_ID", fullArgTaskID}, {"FULL_OVERLAP", fullArgOverlap},
	{"FULL_PREV_TASK", fullArgPrevTask}, {"FULL_TRIGGER_TTL", fullArgTriggerTTL},
	{"FULL_FIRED_REC", fullArgFiredID}, {"FULL_OVERLAP_REC", fullArgOverlapID}, {"FULL_DUPLICATE_REC", fullArgDuplicateID},
	{"FULL_MAX_FIRES", fullArgMaxFires}, {"FULL_MAX_FIRES_SINCE", fullArgMaxFiresSince},
	{"FULL_SKIPPED_COUNT", fullArgSkippedCount}, {"FULL_ARGS", fullArgs},
	{"LEAN_MSG", leanArgMsg}, {"LEAN_TASK_ID", leanArgTaskID}, {"LEAN_FIRED_ID", leanArgFiredID},
	{"LEAN_FIRED_DATA", leanArgFiredData}, {"LEAN_ARGS", leanArgs},
	{"A_BULK", argBulk}, {"A_BULK_CONFIG", argBulkConfig}, {"A_BULK_FRESH", argBulkFresh},
	{"A_BULK_MAX_STALE", argBulkMaxStale}, {"A_BULK_RECORD_ID", argBulkRecordID}, {"A_BULK_RECORDS", argBulkRecords},
	{"A_BULK_FIRST_FIRE", argBulkFirstFire}, {"MULTI_TAG", outbox.MultiRecordTag},
	{"MULTI_ID_PREFIX", outbox.MultiRecordIDPrefix},
	{"BA_TICK", bulkArgTick}, {"BA_EXPECTED", bulkArgExpected}, {"BA_MSG", bulkArgMsg},
	{"BA_TASK_ID", bulkArgTaskID}, {"BULK_ARGS", bulkArgs},
	{"KIND_TICK", kindTick}, {"KIND_TRIGGER", kindTrigger}, {"KIND_BACKFILL", kindBackfill},
	{"OVERLAP_SKIP", overlapSkip}, {"OVERLAP_BUFFER", overlapBuffer}, {"OVERLAP_CANCEL", overlapCancel},
	{"FULL_CANCEL_REC", fullArgCancelID},
	{"CANCEL_DELETED", contract.CancelDeleted}, {"CANCEL_REQUESTED", contract.CancelRequested},
	{"KIND_SKIP", kindSkip}, {"KIND_LEAN", kindLean}, {"KIND_BULK", kindBulk},
})

// luaConstant is one name of a script's prelude: an int or a string.
type luaConstant struct {
	name  string
	value any
}

// luaConstants makes the Lua locals of consts.
func luaConstants(consts []luaConstant) string {
	var b strings.Builder
	b.WriteString("-- The layout, from the Go constants of internal/taskstate/firelayout.go.\n")
	for _, c := range consts {
		switch v := c.value.(type) {
		case int:
			fmt.Fprintf(&b, "local %s = %d\n", c.name, v)
		case string:
			fmt.Fprintf(&b, "local %s = %q\n", c.name, v)
		default:
			panic(fmt.Sprintf("lua constant %s: %T", c.name, v))
		}
	}
	return b.String()
}
