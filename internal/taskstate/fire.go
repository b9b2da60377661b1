package taskstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

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
