package taskstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/redisscript"
	"github.com/cronstream/cronstream/schedule"
)

// This file is the firing side of the package: one atomic script per queue
// slot that decides whether a tick may fire, creates the asynq task exactly as
// asynq's client would, records the outcome in the queue's outbox and moves the
// entry's watermark, all in one step (docs/invariants.md INV-watermark, INV-outbox).

// Freshness is the STRING holding the highest fresh_as_of (unix ms) any fire
// into this slot has presented (the staleness fence).
func (o OwnKeys) Freshness() string { return o.head + "fresh" }

// FireKind says which rules a fire follows.
type FireKind uint8

const (
	// FireTick is a scheduled tick: compare-and-set on the entry's watermark,
	// which it advances to the tick.
	FireTick FireKind = iota
	// FireTrigger is a manual trigger: idempotent per request id, never moves
	// the watermark.
	FireTrigger
	// FireBackfill fires a past tick that has no fired event: idempotent by
	// task id (StatusAlreadyExists is success), never moves the watermark.
	FireBackfill
	// FireSkip creates no task: it records missed ticks the catch-up policy
	// drops (SkippedRecords) and advances the watermark to Tick, under the
	// same compare-and-set and fences as FireTick, so the skipped events are
	// written when the ticks are missed rather than with the next fire.
	FireSkip
)

func (k FireKind) String() string {
	switch k {
	case FireTick:
		return "tick"
	case FireTrigger:
		return "trigger"
	case FireBackfill:
		return "backfill"
	case FireSkip:
		return "skip"
	}
	return "FireKind(" + strconv.Itoa(int(k)) + ")"
}

// Record is one outbox record: an already-encoded CloudEvent and its event id,
// which the relay later uses as Nats-Msg-Id.
type Record struct {
	ID   string
	Data []byte
}

func (r Record) empty() bool { return r.ID == "" && len(r.Data) == 0 }

// Fire is one request to enqueue an entry's task for one tick (or, for
// FireSkip, to record missed ticks). Each kind has its constructor
// (NewTickFire, NewSkipFire, NewTriggerFire, NewBackfillFire), which sets
// what that kind requires; the options below them are set on the result.
// What the firing replica presents of its configuration is the batch's
// (Fences), not the fire's.
type Fire struct {
	// Prefix is the tenant prefix of cronstream's own keys ("" = DefaultPrefix).
	Prefix string
	// Entry is the entry id; Queue the asynq queue the task goes to.
	Entry string
	Queue string
	Kind  FireKind
	// Tick is the scheduled time being fired. For FireTick it becomes the
	// watermark. Watermarks keep millisecond precision.
	Tick time.Time
	// Expected is the watermark the caller believes is stored: the entry's
	// previous fired or skipped tick in this slot. ExpectNone says the entry
	// never fired in this slot. Only FireTick compares them.
	Expected   time.Time
	ExpectNone bool
	// ProcessAt, when later than Redis's clock at the moment of the fire,
	// schedules the task (asynq's Schedule) instead of enqueuing it.
	ProcessAt time.Time
	// Msg is the task message. Msg.Queue may be empty (it is set to Queue);
	// Msg.GroupKey selects asynq's AddToGroup; Msg.UniqueKey is derived when
	// UniqueTTL is set. Msg is not modified.
	Msg *TaskMessage
	// UniqueTTL > 0 takes asynq's unique lock (at least one second).
	UniqueTTL time.Duration
	// OverlapSkip skips the tick while the previous task (PrevTaskID, or the
	// task id stored with the watermark when empty) is still pending,
	// scheduled, retrying, active or aggregating.
	OverlapSkip bool
	PrevTaskID  string
	// OverlapBuffer (FireTick only) holds the tick in the entry's Held key
	// instead of skipping it while the previous task is busy (StatusHeld),
	// and skips it with OverlapRecord while a tick is held already.
	// ReleaseHeld fires a held tick. It excludes OverlapSkip.
	OverlapBuffer bool
	// OverlapCancel (FireTick only; overlap cancel-previous) replaces the
	// previous task while it is busy: one waiting (pending, scheduled,
	// retry, aggregating) is deleted and the tick fires in the same step
	// (StatusFired, FireResult.Replaced); an active one is left for the
	// caller to cancel (PublishCancel) and the tick is held as OverlapBuffer
	// holds it (StatusHeld, FireResult.Replaced), released by ReleaseCancel.
	// Either way CancelRecord is appended. It excludes OverlapSkip and
	// OverlapBuffer.
	OverlapCancel bool
	CancelRecord  CancelRecord
	// RequestID makes a FireTrigger idempotent for TriggerTTL (default 24h);
	// derive the trigger's Msg.ID from it, so a retried trigger is also the
	// same task.
	RequestID  string
	TriggerTTL time.Duration
	// SkippedRecords are the skipped records of a gap the caller resolved by
	// catch-up policy; they are appended before the outcome's record whenever
	// the fire is not refused.
	SkippedRecords []Record
	// MaxFires > 0 limits a FireTick: it creates a task only while fewer
	// than MaxFires of the entry's ticks created one in this slot since
	// revision MaxFiresSince (the slot's fires counter, OwnKeys.Fires,
	// keyed by that revision: another revision counts from zero), and is
	// refused with StatusCompleted at the limit. Only a created task
	// counts. Such a fire takes the script's full path.
	MaxFires      int
	MaxFiresSince uint64
	// FiredRecord is appended when the task is created (required).
	FiredRecord Record
	// OverlapRecord is appended when OverlapSkip or OverlapBuffer skips the
	// tick (required with either).
	OverlapRecord Record
	// DuplicateRecord is appended when asynq's unique lock is held by
	// another task (required with UniqueTTL).
	DuplicateRecord Record
}

// NewTickFire is the fire of entry's scheduled tick into queue (FireTick):
// it creates msg's task and appends fired, if the watermark is still
// expected (hasExpected false: the entry never fired in this slot), and
// moves the watermark to tick. Options (OverlapSkip, UniqueTTL, the gap's
// SkippedRecords, ProcessAt) are set on the result.
func NewTickFire(prefix, queue, entry string, tick, expected time.Time, hasExpected bool, msg *TaskMessage, fired Record) Fire {
	return Fire{Prefix: prefix, Entry: entry, Queue: queue, Kind: FireTick, Tick: tick,
		Expected: expected, ExpectNone: !hasExpected, Msg: msg, FiredRecord: fired}
}

// NewSkipFire records the missed ticks the catch-up policy drops (FireSkip):
// it appends skipped and moves the watermark to last, the last of them, if
// the watermark is still expected; it creates no task.
func NewSkipFire(prefix, queue, entry string, last, expected time.Time, hasExpected bool, skipped []Record) Fire {
	return Fire{Prefix: prefix, Entry: entry, Queue: queue, Kind: FireSkip, Tick: last,
		Expected: expected, ExpectNone: !hasExpected, SkippedRecords: skipped}
}

// NewTriggerFire is a manual trigger of entry at at (FireTrigger): msg's
// task, once per requestID (derive msg's id from it), whatever the
// watermark, which it leaves alone.
func NewTriggerFire(prefix, queue, entry, requestID string, at time.Time, msg *TaskMessage, fired Record) Fire {
	return Fire{Prefix: prefix, Entry: entry, Queue: queue, Kind: FireTrigger, Tick: at,
		RequestID: requestID, Msg: msg, FiredRecord: fired}
}

// NewBackfillFire fires entry's past tick that has no fired event
// (FireBackfill): msg's task unless it exists, whatever the watermark,
// which it leaves alone.
func NewBackfillFire(prefix, queue, entry string, tick time.Time, msg *TaskMessage, fired Record) Fire {
	return Fire{Prefix: prefix, Entry: entry, Queue: queue, Kind: FireBackfill, Tick: tick,
		Msg: msg, FiredRecord: fired}
}

// Fences are what every fire of a batch presents of the firing replica's
// view of the configuration: the script checks them against the slot's
// revision and staleness fences (docs/invariants.md INV-revision-fence,
// INV-staleness-fence) and raises those.
type Fences struct {
	// ConfigSeq is the projection's config stream sequence (revision fence).
	// Sequences above 2^53 lose precision inside the script. ConfigID is
	// the id of the config message at ConfigSeq (events.ConfigMessageID),
	// stored with the fence when a fire raises it; "" stores none.
	ConfigSeq uint64
	ConfigID  string
	// FreshAsOf is when this replica's projection last heard the config
	// stream; MaxStaleness how far it may lag the freshest replica firing
	// into this slot. A zero FreshAsOf presents nothing and is not checked;
	// a zero MaxStaleness records FreshAsOf without checking it.
	FreshAsOf    time.Time
	MaxStaleness time.Duration
}

func (fc Fences) check() error {
	switch {
	case fc.MaxStaleness < 0:
		return fmt.Errorf("%w: negative staleness bound %s", ErrInvalidFire, fc.MaxStaleness)
	case fc.ConfigSeq > 1<<53:
		return fmt.Errorf("%w: config sequence %d above 2^53", ErrInvalidFire, fc.ConfigSeq)
	}
	return nil
}

// fenceArgs are a batch's fences as the script reads them (fireArgConfig,
// fireArgFresh, fireArgMaxStale), made once per batch.
type fenceArgs struct{ config, fresh, maxStale any }

func (fc Fences) args() fenceArgs {
	fa := fenceArgs{config: strconv.FormatUint(fc.ConfigSeq, 10), fresh: "", maxStale: strconv.FormatInt(fc.MaxStaleness.Milliseconds(), 10)}
	if fc.ConfigID != "" {
		fa.config = strconv.FormatUint(fc.ConfigSeq, 10) + ":" + fc.ConfigID
	}
	if !fc.FreshAsOf.IsZero() {
		fa.fresh = strconv.FormatInt(fc.FreshAsOf.UnixMilli(), 10)
	}
	return fa
}

// DefaultTriggerTTL is how long a trigger's request id is remembered.
const DefaultTriggerTTL = 24 * time.Hour

// FireStatus is the outcome of one fire.
type FireStatus int

const (
	// StatusFired: the task was created and the fired record appended.
	StatusFired FireStatus = iota + 1
	// StatusAlreadyExists: the task id already exists (or the trigger's
	// request id was already served). Nothing was created and no fired record
	// appended. For a tick, the watermark still advanced and the gap's
	// skipped records were appended (the watermark moves past those ticks, so
	// their skipped events must exist; event ids make a repeat harmless).
	// For a backfill this is success: the tick already fired.
	StatusAlreadyExists
	// StatusDuplicate: asynq's unique lock is held by another task; the
	// duplicate record was appended and a tick's watermark advanced.
	StatusDuplicate
	// StatusSkippedOverlap: the previous task is still running; the overlap
	// record was appended and a tick's watermark advanced.
	StatusSkippedOverlap
	// StatusSkippedMissed: a FireSkip recorded its skipped records and
	// advanced the watermark.
	StatusSkippedMissed
	// StatusHeld: the previous task is busy and the overlap policy is
	// buffer-one; the tick was stored in the entry's Held key (TaskID is the
	// task it will create) and the watermark advanced. No record yet: the
	// fired record is appended when ReleaseHeld fires it.
	StatusHeld
	// StatusWatermarkMismatch: the stored watermark is not the expected one.
	// FireResult carries the current one; recompute and retry.
	StatusWatermarkMismatch
	// StatusMoved: the entry was handed over to another queue; FireResult
	// carries the revision of the move and this slot's last watermark.
	StatusMoved
	// StatusRevisionFenced: another replica already fired into this slot
	// from a newer configuration; FireResult.Fence is its sequence.
	StatusRevisionFenced
	// StatusStale: this replica's projection lags the freshest one seen in
	// this slot by more than MaxStaleness; FireResult.FreshestAsOf says by
	// how much.
	StatusStale
	// StatusCompleted: the fire's MaxFires ticks already created a task
	// since MaxFiresSince; nothing was written. FireResult.Fires is the
	// count.
	StatusCompleted
)

// String names the status as metrics and logs do: the names of
// schedule.FireStatus, whose list is this one (TestFireStatusMatches).
func (s FireStatus) String() string { return schedule.FireStatus(s).String() }

// Refused reports whether the fire changed nothing because one of its
// preconditions failed.
func (s FireStatus) Refused() bool { return schedule.FireStatus(s).Refused() }

// FireResult is what one fire did.
type FireResult struct {
	Status FireStatus
	// TaskID is the created task (Fired), the existing one (AlreadyExists;
	// for a trigger the task its request id first fired), the previous task
	// still running (SkippedOverlap), or the unique lock's holder (Duplicate).
	TaskID string
	// State is the created task's asynq state: pending, scheduled or
	// aggregating.
	State string
	// Watermark is the slot's watermark after the fire (for refusals: the
	// current one). HasWatermark is false when the entry never fired here.
	Watermark       time.Time
	WatermarkTaskID string
	HasWatermark    bool
	// Fence is the slot's highest config sequence (StatusRevisionFenced);
	// FenceID the id of the config message stored with it ("" unknown).
	Fence   uint64
	FenceID string
	// MovedAt is the revision the entry left this queue at (StatusMoved).
	MovedAt uint64
	// FreshestAsOf is the freshest fresh_as_of seen in the slot (StatusStale).
	FreshestAsOf time.Time
	// Fires is the entry's count of fires towards its limit
	// (StatusCompleted).
	Fires int
	// Replaced is the previous task a fire with OverlapCancel replaced
	// (StatusFired: deleted; StatusHeld: active, to be cancelled), and
	// ReplacedState the asynq state it was in; "" when it replaced none.
	Replaced      string
	ReplacedState string
	// Err is set when this fire's outcome is unknown because Redis failed;
	// retrying the same fire is safe.
	Err error
}

// Errors callers branch on.
var (
	// ErrInvalidFire reports a Fire that cannot be sent (missing fields,
	// inconsistent queue, missing records).
	ErrInvalidFire = errors.New("invalid fire")
)

// Script return codes, mirrored in fireScript.
const (
	codeFired     = 1
	codeExists    = 2
	codeDuplicate = 3
	codeOverlap   = 4
	codeSkipped   = 5
	codeHeld      = 6
	codeMismatch  = -1
	codeMoved     = -2
	codeFenced    = -3
	codeStale     = -4
	codeCompleted = -5
)

// maxFiresPerFlight bounds one pipeline's memory.
const maxFiresPerFlight = 1024

// fireCallSizes: a call of a few fires amortises the round trip and the
// script's fixed cost over its fires, while several calls per pipeline keep
// the server busy as the next call arrives; a large call of fires taken one
// by one makes the server wait for all of it and costs more per fire. A
// bulk call's fixed cost (fences, one read and one write of every
// watermark, one push, one outbox record) is a larger share, and it pays
// to spread it over more fires (figures in docs/benchmarks.md).
var fireCallSizes = callSizes{each: 16, bulk: 64}

// preparedFire is a validated fire with its encoded message.
type preparedFire struct {
	f     *Fire
	msg   []byte
	id    string
	group string
	own   OwnKeys
	keys  QueueKeys
}

// prepareSkip validates a FireSkip, which carries no task.
func prepareSkip(f *Fire, bad func(string, ...any) (preparedFire, error)) (preparedFire, error) {
	switch {
	case f.Tick.IsZero():
		return bad("zero tick")
	case !f.ExpectNone && f.Expected.IsZero():
		return bad("no expected watermark (set ExpectNone for an entry that never fired)")
	case !f.ExpectNone && f.Tick.UnixMilli() <= f.Expected.UnixMilli():
		return bad("tick is not after the expected watermark %s", f.Expected.UTC().Format(time.RFC3339Nano))
	case len(f.SkippedRecords) == 0:
		return bad("a skip without skipped records")
	}
	for i, r := range f.SkippedRecords {
		if err := checkRecord(fmt.Sprintf("skipped[%d]", i), r, true); err != nil {
			return bad("%v", err)
		}
	}
	// The per-fire task keys are never touched by a skip; the queue's task
	// key prefix stands in for them (a real key name of the same slot).
	return preparedFire{f: f, keys: Keys(f.Queue)}, nil
}

// prepare validates f and encodes its message at the end of msgs; keys
// are those of f's queue.
func prepare(f *Fire, keys QueueKeys, msgs *[]byte) (preparedFire, error) {
	bad := func(format string, args ...any) (preparedFire, error) {
		return preparedFire{}, fmt.Errorf("%w: entry %q tick %s: %s", ErrInvalidFire, f.Entry, f.Tick.UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
	}
	if f.Entry == "" {
		return bad("empty entry id")
	}
	if f.Queue == "" {
		return bad("empty queue")
	}
	if f.Kind == FireSkip {
		return prepareSkip(f, bad)
	}
	if f.Msg == nil {
		return bad("no task message")
	}
	if strings.TrimSpace(f.Msg.Type) == "" {
		return bad("blank task type")
	}
	if f.Msg.ID == "" {
		return bad("empty task id")
	}
	if f.Msg.Queue != "" && f.Msg.Queue != f.Queue {
		return bad("message queue %q differs from fire queue %q", f.Msg.Queue, f.Queue)
	}
	if f.Tick.IsZero() {
		return bad("zero tick")
	}
	switch f.Kind {
	case FireTick:
		if !f.ExpectNone && f.Expected.IsZero() {
			return bad("no expected watermark (set ExpectNone for an entry that never fired)")
		}
		if !f.ExpectNone && f.Tick.UnixMilli() <= f.Expected.UnixMilli() {
			return bad("tick is not after the expected watermark %s", f.Expected.UTC().Format(time.RFC3339Nano))
		}
		if f.MaxFires < 0 {
			return bad("negative max fires %d", f.MaxFires)
		}
		if f.MaxFires > 0 && (f.MaxFiresSince == 0 || f.MaxFiresSince > 1<<53) {
			return bad("max fires without the revision it counts from (1 to 2^53)")
		}
	case FireTrigger:
		if f.RequestID == "" {
			return bad("trigger without request id")
		}
	case FireBackfill:
	default:
		return bad("unknown kind %d", f.Kind)
	}
	if f.UniqueTTL != 0 && f.UniqueTTL < time.Second {
		return bad("unique TTL %s is below asynq's minimum of 1s", f.UniqueTTL)
	}
	if f.TriggerTTL < 0 {
		return bad("negative trigger TTL")
	}
	if err := checkRecord("fired", f.FiredRecord, true); err != nil {
		return bad("%v", err)
	}
	if f.OverlapBuffer && (f.OverlapSkip || f.Kind != FireTick) {
		return bad("OverlapBuffer is for a FireTick without OverlapSkip")
	}
	if f.OverlapCancel && (f.OverlapSkip || f.OverlapBuffer || f.Kind != FireTick) {
		return bad("OverlapCancel is for a FireTick without OverlapSkip or OverlapBuffer")
	}
	if err := f.CancelRecord.check(f.OverlapCancel); err != nil {
		return bad("%v", err)
	}
	if err := checkRecord("overlap", f.OverlapRecord, f.OverlapSkip || f.OverlapBuffer || f.OverlapCancel); err != nil {
		return bad("%v", err)
	}
	if err := checkRecord("duplicate", f.DuplicateRecord, f.UniqueTTL > 0); err != nil {
		return bad("%v", err)
	}
	for i, r := range f.SkippedRecords {
		if err := checkRecord(fmt.Sprintf("skipped[%d]", i), r, true); err != nil {
			return bad("%v", err)
		}
	}
	msg := *f.Msg
	msg.Queue = f.Queue
	if f.UniqueTTL > 0 {
		msg.UniqueKey = keys.Unique(msg.Type, msg.Payload)
	}
	start := len(*msgs)
	enc, err := AppendTaskMessage(*msgs, &msg)
	if err != nil {
		return bad("%v", err)
	}
	// Capped: a later append never writes into this fire's message, even
	// when the buffer has room after it.
	*msgs = enc
	return preparedFire{f: f, msg: enc[start:len(enc):len(enc)], id: msg.ID, group: msg.GroupKey, keys: keys}, nil
}

func checkRecord(name string, r Record, required bool) error {
	if r.empty() {
		if required {
			return fmt.Errorf("missing %s record", name)
		}
		return nil
	}
	if r.ID == "" || len(r.Data) == 0 {
		return fmt.Errorf("%s record needs both an event id and data", name)
	}
	return nil
}

// appendFire adds p's keys and arguments to a chunk's KEYS and ARGV, laid
// out as firelayout.go names them: the lean path's when the fire takes it,
// else the full path's.
func appendFire(keys []any, args []any, p preparedFire, nums *numArgs, fa fenceArgs, path firePath) ([]any, []any) {
	f := p.f
	task := p.keys.Task(p.id)
	if path != pathFull && p.lean() {
		var k [leanKeys]string
		k[fireKeyWatermark], k[fireKeyMarker], k[fireKeyTask] = p.own.Watermark(f.Entry), p.own.Handover(f.Entry), task
		var a [leanArgs]any
		a[fireArgKind] = kindLean
		a[fireArgTick] = nums.arg(numTick, f.Tick.UnixMilli())
		a[fireArgExpected] = expectedArg(f, nums)
		a[fireArgConfig], a[fireArgFresh], a[fireArgMaxStale] = fa.config, fa.fresh, fa.maxStale
		a[leanArgMsg] = p.msg
		a[leanArgTaskID] = p.id
		a[leanArgFiredID], a[leanArgFiredData] = f.FiredRecord.ID, f.FiredRecord.Data
		return appendKeys(keys, k[:]), append(args, a[:]...)
	}
	var k [fullKeys]string
	k[fireKeyWatermark], k[fireKeyMarker], k[fireKeyTask] = p.own.Watermark(f.Entry), p.own.Handover(f.Entry), task
	k[fireKeyUnique], k[fireKeyGroup], k[fireKeyTrigger], k[fireKeyFires] = task, task, task, task
	k[fireKeyHeld], k[fireKeyHeldIndex] = task, task
	if f.OverlapBuffer || f.OverlapCancel {
		k[fireKeyHeld], k[fireKeyHeldIndex] = p.own.Held(f.Entry), p.own.HeldIndex()
	}
	limited := f.Kind == FireTick && f.MaxFires > 0
	if limited {
		k[fireKeyFires] = p.own.Fires(f.Entry)
	}
	if f.UniqueTTL > 0 && f.Msg != nil {
		k[fireKeyUnique] = p.keys.Unique(f.Msg.Type, f.Msg.Payload)
	}
	if p.group != "" {
		k[fireKeyGroup] = p.keys.Group(p.group)
	}
	kind := kindTick
	switch f.Kind {
	case FireTrigger:
		kind = kindTrigger
		k[fireKeyTrigger] = p.own.Trigger(f.RequestID)
	case FireBackfill:
		kind = kindBackfill
	case FireSkip:
		kind = kindSkip
	}
	keys = appendKeys(keys, k[:])

	expected := ""
	if (f.Kind == FireTick || f.Kind == FireSkip) && !f.ExpectNone {
		expected = strconv.FormatInt(f.Expected.UnixMilli(), 10)
	}
	var processAt int64
	if !f.ProcessAt.IsZero() {
		processAt = f.ProcessAt.UnixMilli()
	}
	overlap := overlapAllow
	switch {
	case f.OverlapSkip:
		overlap = overlapSkip
	case f.OverlapBuffer:
		overlap = overlapBuffer
	case f.OverlapCancel:
		overlap = overlapCancel
	}
	triggerTTL := f.TriggerTTL
	if triggerTTL == 0 {
		triggerTTL = DefaultTriggerTTL
	}
	var a [fullArgs]any
	a[fireArgKind] = kind
	a[fireArgTick] = strconv.FormatInt(f.Tick.UnixMilli(), 10)
	a[fireArgExpected] = expected
	a[fireArgConfig], a[fireArgFresh], a[fireArgMaxStale] = fa.config, fa.fresh, fa.maxStale
	a[fullArgProcessAt] = strconv.FormatInt(processAt, 10)
	a[fullArgUniqueTTL] = strconv.FormatInt(f.UniqueTTL.Milliseconds(), 10)
	a[fullArgGroup] = p.group
	a[fullArgMsg] = p.msg
	a[fullArgTaskID] = p.id
	a[fullArgOverlap] = overlap
	a[fullArgPrevTask] = f.PrevTaskID
	a[fullArgTriggerTTL] = strconv.FormatInt(max(triggerTTL.Milliseconds(), 1), 10)
	a[fullArgFiredID], a[fullArgFiredData] = f.FiredRecord.ID, f.FiredRecord.Data
	a[fullArgOverlapID], a[fullArgOverlapData] = f.OverlapRecord.ID, f.OverlapRecord.Data
	a[fullArgDuplicateID], a[fullArgDuplicateData] = f.DuplicateRecord.ID, f.DuplicateRecord.Data
	a[fullArgCancelID] = f.CancelRecord.ID
	for i, part := range f.CancelRecord.parts {
		a[fullArgCancelData1+i] = part
	}
	a[fullArgMaxFires], a[fullArgMaxFiresSince] = "0", "0"
	if limited {
		a[fullArgMaxFires] = strconv.Itoa(f.MaxFires)
		a[fullArgMaxFiresSince] = strconv.FormatUint(f.MaxFiresSince, 10)
	}
	a[fullArgSkippedCount] = len(f.SkippedRecords)
	args = append(args, a[:]...)
	for _, r := range f.SkippedRecords {
		args = append(args, r.ID, r.Data)
	}
	return keys, args
}

// firePath chooses the script's paths; only tests force one.
type firePath uint8

const (
	// pathAuto: bulk for a chunk that qualifies, else lean for each plain
	// tick and the full path for the rest.
	pathAuto firePath = iota
	// pathEach: never bulk (lean or full per fire).
	pathEach
	// pathFull: the full path for every fire.
	pathFull
)

// bulkable reports whether a chunk takes the script's bulk path: every fire
// a plain tick (lean), of a different entry (the batch's fences are
// presented once).
func bulkable(fires []*preparedFire) bool {
	for i, p := range fires {
		f := p.f
		if !p.lean() {
			return false
		}
		for _, q := range fires[:i] {
			if q.f.Entry == f.Entry {
				return false
			}
		}
	}
	return true
}

// appendKeys appends each key name of k to keys, a call's KEYS.
func appendKeys(keys []any, k []string) []any {
	for _, key := range k {
		keys = append(keys, key)
	}
	return keys
}

// appendBulk adds a bulkable chunk's keys and arguments in the bulk path's
// layout: the blocks of watermarks, moved-markers and task keys; the
// common fence arguments once, then bulkArgs arguments per fire.
//
// The fires' key names are written into a.keys, and the multi-record of
// their records into a.records, the flight's scratch, and passed as
// slices of it: a burst then makes no string per key or record.
func appendBulk(keys []any, args []any, a *flightArena, fires []*preparedFire, nums *numArgs, fa fenceArgs) ([]any, []any) {
	n := len(fires)
	at := len(keys)
	keys = slices.Grow(keys, 3*n)[:at+3*n]
	names := a.keys
	name := func(from int) []byte { return names[from:len(names):len(names)] }
	for i, p := range fires {
		from := len(names)
		names = p.own.AppendWatermark(names, p.f.Entry)
		keys[at+bulkBlockWatermark*n+i] = name(from)
		from = len(names)
		names = p.own.AppendHandover(names, p.f.Entry)
		keys[at+bulkBlockMarker*n+i] = name(from)
		from = len(names)
		names = p.keys.AppendTask(names, p.id)
		keys[at+bulkBlockTask*n+i] = name(from)
	}
	a.keys = names
	records := &a.records
	from := len(*records)
	recs := append(*records, outbox.MultiRecordTag...)
	for _, p := range fires {
		recs = outbox.AppendFrame(recs, p.f.FiredRecord.ID, p.f.FiredRecord.Data)
	}
	*records = recs
	recs = recs[from:len(recs):len(recs)]
	var head [argBulkFirstFire - argBulk]any
	head[argBulk-argBulk] = kindBulk
	head[argBulkConfig-argBulk] = fa.config
	head[argBulkFresh-argBulk] = fa.fresh
	head[argBulkMaxStale-argBulk] = fa.maxStale
	head[argBulkRecordID-argBulk] = outbox.MultiRecordID(fires[0].f.FiredRecord.ID)
	head[argBulkRecords-argBulk] = recs
	args = append(args, head[:]...)
	for _, p := range fires {
		f := p.f
		var a [bulkArgs]any
		a[bulkArgTick] = nums.arg(numTick, f.Tick.UnixMilli())
		a[bulkArgExpected] = expectedArg(f, nums)
		a[bulkArgMsg] = p.msg
		a[bulkArgTaskID] = p.id
		args = append(args, a[:]...)
	}
	return keys, args
}

func expectedArg(f *Fire, nums *numArgs) any {
	if f.ExpectNone {
		return ""
	}
	return nums.arg(numExpected, f.Expected.UnixMilli())
}

// numArgs remembers the last decimal argument made for each of a few
// numeric fields: in a burst every fire has the same tick and expected
// watermark, and the string and its boxing are then made once instead of
// once per fire.
type numArgs struct {
	set  [2]bool
	val  [2]int64
	args [2]any
}

// Fields numArgs remembers.
const (
	numExpected = iota
	numTick
)

func (n *numArgs) arg(i int, v int64) any {
	if !n.set[i] || n.val[i] != v {
		n.set[i], n.val[i], n.args[i] = true, v, strconv.FormatInt(v, 10)
	}
	return n.args[i]
}

// lean reports whether p takes the fire script's short path: a plain tick
// that enqueues a pending task with nothing else to check or record (a fire
// limit is a check: limited fires take the full path).
func (p preparedFire) lean() bool {
	f := p.f
	return f.Kind == FireTick && !f.OverlapSkip && !f.OverlapBuffer && !f.OverlapCancel && f.UniqueTTL <= 0 && p.group == "" &&
		f.ProcessAt.IsZero() && len(f.SkippedRecords) == 0 && f.MaxFires <= 0
}

// fireCall is one script call: a chunk of fires into one queue.
type fireCall struct {
	prefix  string
	queue   string
	indexes []int // positions in the caller's slice
	fires   []*preparedFire
	bulk    bool // on the script's bulk path
	// args is the whole command: EVALSHA, the script's hash, the number of
	// keys, the keys, the arguments (built once, at its final size).
	args []any
	cmd  *redis.Cmd
}

// callSizes bounds the fires of one script call: a call on the bulk path
// takes up to bulk, any other up to each.
type callSizes struct{ each, bulk int }

// chunkFires groups fires by (prefix, queue) in first-seen order, keeping the
// caller's order inside each group, and cuts each group into calls: runs of
// up to sizes.bulk fires, each one bulk call when it qualifies, else calls
// of up to sizes.each fires.
//
// The calls' commands are laid out in arena (grown as needed), which must
// outlive the calls; fireBatch reuses it from flight to flight.
func chunkFires(prepared []preparedFire, offset int, sizes callSizes, fa fenceArgs, path firePath, arena *flightArena) []*fireCall {
	type slot struct{ prefix, queue string }
	open := make(map[slot]*fireCall)
	var runs []*fireCall
	perRun := max(sizes.each, sizes.bulk)
	for i := range prepared {
		p := &prepared[i]
		key := slot{p.f.Prefix, p.f.Queue}
		if key.prefix == "" {
			key.prefix = DefaultPrefix
		}
		call := open[key]
		if call == nil || len(call.indexes) >= perRun {
			n := min(perRun, len(prepared)-i)
			call = &fireCall{prefix: key.prefix, queue: p.f.Queue, indexes: make([]int, 0, n), fires: make([]*preparedFire, 0, n)}
			open[key] = call
			runs = append(runs, call)
		}
		call.indexes = append(call.indexes, offset+i)
		call.fires = append(call.fires, p)
	}
	calls := make([]*fireCall, 0, len(runs))
	for _, run := range runs {
		// A single fire takes the lean path, which writes its own record.
		run.bulk = path == pathAuto && len(run.fires) > 1 && len(run.fires) <= sizes.bulk && bulkable(run.fires)
		if run.bulk || len(run.fires) <= sizes.each {
			calls = append(calls, run)
			continue
		}
		// Consecutive calls of one queue run in order (one pipeline).
		for from := 0; from < len(run.fires); from += sizes.each {
			to := min(from+sizes.each, len(run.fires))
			calls = append(calls, &fireCall{prefix: run.prefix, queue: run.queue, indexes: run.indexes[from:to:to], fires: run.fires[from:to:to]})
		}
	}
	// Keys and arguments interleave per fire, so each call's are gathered
	// in scratch space and then laid out in one slice.
	var keys []any
	var args []any
	var nums numArgs
	cmds := arena.cmds[:0]
	ends := make([]int, len(calls))
	for c, call := range calls {
		first := call.fires[0]
		own := first.own
		var common [keyFirstFire - 1]string
		common[keyFence-1] = own.Fence()
		common[keyFreshness-1] = own.Freshness()
		common[keyOutbox-1] = own.Outbox()
		common[keyPending-1] = first.keys.Pending()
		common[keyScheduled-1] = first.keys.Scheduled()
		common[keyGroups-1] = first.keys.Groups()
		common[keyFenceID-1] = own.FenceID()
		keys = appendKeys(keys[:0], common[:])
		var head [argFirstFire - 1]any
		head[argTaskPrefix-1] = first.keys.TaskPrefix()
		head[argFires-1] = len(call.fires)
		args = append(args[:0], head[:]...)
		if call.bulk {
			keys, args = appendBulk(keys, args, arena, call.fires, &nums, fa)
		} else {
			for _, p := range call.fires {
				keys, args = appendFire(keys, args, *p, &nums, fa, path)
			}
		}
		cmds = append(cmds, "evalsha", fireScript.Hash(), len(keys))
		cmds = append(cmds, keys...)
		cmds = append(cmds, args...)
		ends[c] = len(cmds)
	}
	// Sliced once the arena is done growing.
	start := 0
	for c, call := range calls {
		call.args = cmds[start:ends[c]:ends[c]]
		start = ends[c]
	}
	arena.cmds = cmds
	return calls
}

// flightArena is the scratch of one flight's commands: the commands, and
// the bytes of the key names and multi-records they pass. None is read
// once the flight's pipeline is written and answered.
type flightArena struct {
	cmds    []any
	keys    []byte
	records []byte
}

// reset empties a for the next flight, keeping its room; the commands are
// cleared so they keep no message or record alive.
func (a *flightArena) reset() {
	clear(a.cmds)
	a.cmds, a.keys, a.records = a.cmds[:0], a.keys[:0], a.records[:0]
}

// preparedBatch is a batch's prepared fires and their encoded messages,
// each fire's msg a slice of msgs: a burst's batches reuse the same few
// buffers instead of allocating a message per fire.
type preparedBatch struct {
	fires []preparedFire
	msgs  []byte
}

// Scratch reused across fire batches (which may run concurrently): a
// flight's commands, and a batch's prepared fires. Each is cleared before
// it goes back, so it keeps no message or record alive; the messages'
// bytes are only read while the batch's calls are sent.
var (
	cmdArenas    = sync.Pool{New: func() any { return new(flightArena) }}
	preparedBufs = sync.Pool{New: func() any { return new(preparedBatch) }}
)

// runFireCalls sends the queue registrations and every call in one pipeline.
// The registrations are plain commands beside the scripts: asynq:queues (so
// the Inspector and CLI see the queue, as asynq's client does before each
// enqueue) and the tenant's set of queues with an outbox (so the relay finds
// every outbox). Re-adding is cheap inside a pipeline, so nothing is cached.
func runFireCalls(ctx context.Context, c redis.UniversalClient, calls []*fireCall) {
	batch := redisscript.NewBatch(c)
	registered := make(map[[2]string]bool)
	for _, call := range calls {
		if slot := [2]string{call.prefix, call.queue}; !registered[slot] {
			registered[slot] = true
			batch.Pipe().SAdd(ctx, AllQueuesKey, call.queue)
			batch.Pipe().SAdd(ctx, OutboxesKey(call.prefix), call.queue)
		}
		// As Script.Cmd builds it, so a cluster client routes it by its
		// first key.
		call.cmd = redis.NewCmd(ctx, call.args...)
		call.cmd.SetFirstKeyPos(3)
		batch.Process(ctx, fireScript, call.cmd)
	}
	batch.Exec(ctx)
}

// FireOnce fires f, presenting fences, in one atomic script call. Refusals
// are statuses, not errors; an error means the fire was invalid or Redis
// failed (the outcome is then unknown, and firing the same Fire again is
// safe).
func (s *Store) FireOnce(ctx context.Context, fences Fences, f Fire) (FireResult, error) {
	res, err := s.fireBatch(ctx, fences, []Fire{f}, nil, fireCallSizes)
	if err != nil {
		return FireResult{}, err
	}
	if res[0].Err != nil {
		return res[0], res[0].Err
	}
	return res[0], nil
}

// FireBatch fires many fires, each presenting fences, grouped per queue (and
// per tenant prefix) into script calls of up to fireCallSizes fires each,
// sent in pipelines. Fires
// of one queue run in the order given, so a later fire sees the watermark an
// earlier one moved. The results are in the order of fires. A fire whose call
// failed has Err set; FireBatch then also returns an error. An invalid fire
// or invalid fences fail the whole batch before anything is sent.
//
// FireBatch does not look at the outbox backlog: the scheduler pauses firing
// on OutboxLen.
func (s *Store) FireBatch(ctx context.Context, fences Fences, fires []Fire) ([]FireResult, error) {
	return s.fireBatch(ctx, fences, fires, nil, fireCallSizes)
}

// FireBatchInto is FireBatch writing the results into results' room when
// it holds len(fires) (else into a new slice): a caller that fires batch
// after batch reuses one slice of results.
func (s *Store) FireBatchInto(ctx context.Context, fences Fences, fires []Fire, results []FireResult) ([]FireResult, error) {
	return s.fireBatch(ctx, fences, fires, results, fireCallSizes)
}

// FiredPending is the result of a fire that created task taskID, pending,
// for tick, with nothing else to report: the common outcome, which follows
// from the fire alone. A caller holding the results of many fires may keep
// a result equal to it as the task id and tick.
func FiredPending(taskID string, tick time.Time) FireResult {
	return FireResult{Status: StatusFired, TaskID: taskID, State: "pending",
		Watermark: time.UnixMilli(tick.UnixMilli()).UTC(), WatermarkTaskID: taskID, HasWatermark: true}
}

// fireBatch is FireBatch with the results' room and the call sizes as
// parameters: sizes {1, 1} sends a pipeline of one script call per fire
// (the benchmark's comparison).
func (s *Store) fireBatch(ctx context.Context, fences Fences, fires []Fire, into []FireResult, sizes callSizes) ([]FireResult, error) {
	if err := fences.check(); err != nil {
		return nil, err
	}
	fa := fences.args()
	batch := preparedBufs.Get().(*preparedBatch)
	prepared := slices.Grow(batch.fires[:0], len(fires))[:len(fires)]
	msgs := batch.msgs[:0]
	arena := cmdArenas.Get().(*flightArena)
	defer func() {
		clear(prepared)
		batch.fires, batch.msgs = prepared[:0], msgs[:0]
		preparedBufs.Put(batch)
		arena.reset()
		cmdArenas.Put(arena)
	}()
	for i := range fires {
		if err := s.CheckQueue(fires[i].Queue); err != nil {
			return nil, fmt.Errorf("%w: entry %q: %w", ErrInvalidFire, fires[i].Entry, err)
		}
		// The fires of a batch mostly share one slot: its key names are
		// made once.
		var keys QueueKeys
		sameSlot := i > 0 && fires[i].Prefix == fires[i-1].Prefix && fires[i].Queue == fires[i-1].Queue
		if sameSlot {
			keys = prepared[i-1].keys
		} else {
			keys = Keys(fires[i].Queue)
		}
		p, err := prepare(&fires[i], keys, &msgs)
		if err != nil {
			return nil, err
		}
		if sameSlot {
			p.own = prepared[i-1].own
		} else {
			p.own = Own(fires[i].Prefix, fires[i].Queue)
		}
		prepared[i] = p
	}
	var results []FireResult
	if cap(into) >= len(fires) {
		results = into[:len(fires)]
		clear(results)
	} else {
		results = make([]FireResult, len(fires))
	}
	var failed int
	var firstErr error
	for start := 0; start < len(prepared); start += maxFiresPerFlight {
		end := min(start+maxFiresPerFlight, len(prepared))
		calls := chunkFires(prepared[start:end], start, sizes, fa, s.firePath, arena)
		runFireCalls(ctx, s.client, calls)
		for _, call := range calls {
			decodeFireCall(call, results)
		}
		arena.reset()
		for i := start; i < end; i++ {
			if results[i].Err != nil {
				failed++
				if firstErr == nil {
					firstErr = results[i].Err
				}
			}
		}
	}
	if firstErr != nil {
		return results, fmt.Errorf("fire batch: %d of %d fires failed: %w", failed, len(fires), firstErr)
	}
	return results, nil
}

// decodeFireCall stores call's per-fire outcomes in results.
func decodeFireCall(call *fireCall, results []FireResult) {
	fail := func(err error) {
		for _, i := range call.indexes {
			results[i] = FireResult{Err: fmt.Errorf("fire into queue %q: %w", call.queue, err)}
		}
	}
	raw, err := call.cmd.Slice()
	if err != nil {
		fail(err)
		return
	}
	if len(raw) != len(call.indexes) {
		fail(fmt.Errorf("fire script returned %d results for %d fires", len(raw), len(call.indexes)))
		return
	}
	for n, i := range call.indexes {
		if code, ok := raw[n].(int64); ok && code == codeFired {
			// The short path's "fired, pending": the rest is what was sent.
			p := call.fires[n]
			results[i] = FiredPending(p.id, p.f.Tick)
			continue
		}
		r, err := parseFireReply(raw[n])
		if err != nil {
			r = FireResult{Err: fmt.Errorf("fire into queue %q: %w", call.queue, err)}
		}
		results[i] = r
	}
}

func parseFireReply(v any) (FireResult, error) {
	row, ok := v.([]any)
	if !ok || len(row) != 6 {
		return FireResult{}, fmt.Errorf("unexpected fire script reply %v", v)
	}
	code, ok := row[0].(int64)
	if !ok {
		return FireResult{}, fmt.Errorf("unexpected fire script code %v", row[0])
	}
	str := func(i int) string { s, _ := row[i].(string); return s }
	var r FireResult
	if wm := str(1); wm != "" {
		ms, err := strconv.ParseInt(wm, 10, 64)
		if err != nil {
			return FireResult{}, fmt.Errorf("stored watermark %q: %w", wm, err)
		}
		r.Watermark, r.WatermarkTaskID, r.HasWatermark = time.UnixMilli(ms).UTC(), str(2), true
	}
	r.TaskID, r.State = str(4), str(5)
	extra := str(3)
	switch code {
	case codeSkipped:
		r.Status = StatusSkippedMissed
	case codeFired:
		r.Status = StatusFired
		r.ReplacedState, r.Replaced, _ = strings.Cut(extra, " ")
	case codeExists:
		r.Status = StatusAlreadyExists
	case codeDuplicate:
		r.Status = StatusDuplicate
	case codeOverlap:
		r.Status = StatusSkippedOverlap
	case codeHeld:
		r.Status = StatusHeld
		r.ReplacedState, r.Replaced, _ = strings.Cut(extra, " ")
	case codeMismatch:
		r.Status = StatusWatermarkMismatch
	case codeMoved:
		r.Status = StatusMoved
		r.MovedAt, _ = strconv.ParseUint(extra, 10, 64)
	case codeFenced:
		r.Status = StatusRevisionFenced
		seq, id, _ := strings.Cut(extra, ":")
		r.Fence, _ = strconv.ParseUint(seq, 10, 64)
		r.FenceID = id
	case codeCompleted:
		r.Status = StatusCompleted
		r.Fires, _ = strconv.Atoi(extra)
	case codeStale:
		r.Status = StatusStale
		if ms, err := strconv.ParseInt(extra, 10, 64); err == nil {
			r.FreshestAsOf = time.UnixMilli(ms).UTC()
		}
	default:
		return FireResult{}, fmt.Errorf("unknown fire script code %d", code)
	}
	return r, nil
}
