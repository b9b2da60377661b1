// Package scheduler fires every registered entry's ticks into Redis as asynq
// tasks, exactly once across any number of replicas (docs/design.md "Why
// each tick fires exactly once").
//
// It owns fire-time computation (Schedule), the firing loop (one timer over a
// min-heap of due instants) for the entries of the shards this replica owns
// (Shards), catch-up after outages, manual triggers and backfills. It never
// decides alone
// that a tick may fire: every fire is one atomic script in Redis that
// compares-and-sets the entry's watermark and checks the revision and
// staleness fences, so two replicas can never both fire one tick. It never
// publishes to NATS: fired and skipped events go into the Redis outbox in
// the same step as the task, and the relay publishes them. It reads the
// streams only through History: an entry's earlier queues (to close them
// before firing into a new one) and its last fire (to restore a watermark
// Redis lost).
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// Where things are, in the order a tick goes through them:
//
//   - scheduler.go: Config, New, Start/Stop and the loop, one goroutine that
//     owns every entry's state.
//   - machine.go: the entry state machine, with its table: every change
//     of an entry's state (entryState), how it follows the projection
//     (applyChange) and when it is due (schedule); entry.go: what a run
//     holds (entryRun).
//   - load.go: reading watermarks, queue handovers, restoring a watermark
//     Redis lost; history.go: what the streams say for that.
//   - owned.go: which entries are this replica's (the shards it owns),
//     runs built when a shard is taken and dropped when it goes;
//     shards.go: the Shards interface ownership implements.
//   - plan.go: what a due entry fires now (its tick, or catch-up by
//     catchup.go, excluded ticks by exclude.go) and the fires' records;
//     taskmessage.go: their tasks.
//   - firepass.go: one pass of fires, batched per queue, in parallel.
//   - apply.go: what each fire's result changes.
//   - held.go, cancel.go: the overlap policies buffer-one and
//     cancel-previous, whose held ticks are released or dropped.
//   - restore.go, lost.go: a watermark Redis lost, restored by proposal,
//     and the fires it lost recorded; streamreads.go: reads of the streams
//     bounded in time.
//   - asynqvisibility.go: asynq's scheduler entries and enqueue history, for
//     asynq's CLI and asynqmon.
//   - epoch.go: fences left by an earlier config stream, cleared.
//   - manual.go: triggers and backfills, without a running scheduler.
//   - dueheap.go: the entries by due instant (their ticks are package
//     schedule's); clock.go: the clock it runs on.
//   - outcome.go, metrics.go, entrymetrics.go, capacity.go: what the
//     scheduler reports; pools.go: buffers reused across passes;
//     activityid.go: the fired and skipped events' ids.

// Broker is the scheduler's seam to Redis; *taskstate.Store implements
// it. Another implementation (Config.Broker) serves simulations and fault
// tests; it must keep each call's semantics, above all the fire's
// compare-and-set of the watermark (docs/design.md INV-watermark).
type Broker interface {
	FireBatchInto(ctx context.Context, fences taskstate.Fences, fires []taskstate.Fire, results []taskstate.FireResult) ([]taskstate.FireResult, error)
	Watermarks(ctx context.Context, prefix, queue string, entries []string) ([]taskstate.WatermarkInfo, error)
	CloseForHandover(ctx context.Context, prefix, oldQueue, entry string, revision uint64, configID string) (time.Time, string, bool, error)
	SeedWatermark(ctx context.Context, prefix, newQueue, entry string, tick time.Time, taskID string, revision uint64, configID string) error
	RestoreWatermark(ctx context.Context, prefix, queue, entry string, tick time.Time, taskID string, revision uint64, configID string, lost *taskstate.LostRecord) (bool, error)
	FireCount(ctx context.Context, prefix, queue, entry string) (taskstate.FireCount, bool, error)
	SeedFireCount(ctx context.Context, prefix, queue, entry string, c taskstate.FireCount) (taskstate.FireCount, error)
	ClearFence(ctx context.Context, prefix, queue string, seq uint64) (bool, error)
	ClearHandover(ctx context.Context, prefix, queue, entry string, revision uint64) (bool, error)
	HandoverID(ctx context.Context, prefix, queue, entry string, revision uint64) (string, error)
	WriteSchedulerEntries(ctx context.Context, schedulerID string, entries []taskstate.SchedulerEntry, ttl time.Duration) error
	ClearSchedulerEntries(ctx context.Context, schedulerID string) error
	RecordSchedulerEnqueueEvents(ctx context.Context, events []taskstate.EnqueueEventRecord) error
	HeldTicks(ctx context.Context, prefix string, queues []string) ([]taskstate.HeldTick, error)
	Queues(ctx context.Context) ([]string, error)
	ReleaseHeld(ctx context.Context, fences taskstate.Fences, h taskstate.HeldTick, how taskstate.HeldRelease) (taskstate.HeldOutcome, error)
	ReleaseCancel(ctx context.Context, fences taskstate.Fences, h taskstate.HeldTick, how taskstate.HeldRelease) (taskstate.CancelRelease, error)
	PublishCancel(ctx context.Context, taskID string) error
	ProposeRestore(ctx context.Context, prefix, queue, entry string, tick time.Time, taskID string, settle time.Duration) (taskstate.RestoreProposal, error)
	OpenRestore(ctx context.Context, prefix, queue, entry string, settle time.Duration) (taskstate.RestoreProposal, error)
	ClearRestore(ctx context.Context, prefix, queue, entry string, tick time.Time) error
	RestoreProposals(ctx context.Context, prefix string, queues []string) (map[string]map[string]time.Time, error)
}

// Projection is what the scheduler reads of the live projection;
// *projector.Projector implements it.
type Projection interface {
	Subscribe() *projector.Subscription
	// FenceSeq is the config sequence the scheduler presents to the
	// revision fence (projector.Fold.FenceSeq).
	FenceSeq() uint64
	// ConfigMessageID is events.ConfigMessageID of the message at seq, ""
	// when not known (seq is not the last applied).
	ConfigMessageID(seq uint64) string
	LastHeard() time.Time
	WaitCaughtUp(ctx context.Context) error
	// Get and Quarantined tell what became of the entry of a held tick.
	Get(id string) (projector.State, bool)
	Quarantined() []projector.Quarantine
}

// Defaults, each overridable in Config.
const (
	DefaultGrace        = 5 * time.Second
	DefaultMaxStaleness = 30 * time.Second
	DefaultMaxCatchup   = 100
	DefaultBatch        = 1000
	DefaultParallel     = 4
	DefaultVisibility   = 10 * time.Second
)

// Config configures a Scheduler. Zero values mean the defaults.
type Config struct {
	// Redis is the asynq Redis (single, Sentinel or Cluster client) the
	// scheduler fires into.
	Redis      redis.UniversalClient
	Projection Projection
	// Shards says which shards this replica owns: it fires only their
	// entries (nil: every entry, as a lone replica).
	Shards    Shards
	Names     events.Names
	ReplicaID string
	Clock     *Clock // nil: the local clock, uncorrected
	// Grace: a tick counts as missed (and goes to the catch-up policy) only
	// once it is older than this.
	Grace time.Duration
	// MaxStaleness: how far this replica's view of the config stream may lag
	// the freshest replica firing into the same queue.
	MaxStaleness time.Duration
	// MaxCatchup bounds the missed ticks one entry fires per pass (policy
	// all); the rest follow in the next passes.
	MaxCatchup int
	// Batch bounds the fires sent to Redis in one call.
	Batch int
	// Parallel bounds the batches in flight at once (default 4).
	Parallel int
	// OutboxBytes returns the Redis memory the relay's outbox backlog takes;
	// firing pauses while it is above MaxOutboxBytes (0: no bound). A bound
	// in bytes, not records, is what keeps Redis from filling, and it lets
	// firing ride out a long NATS outage.
	OutboxBytes    func() int64
	MaxOutboxBytes int64
	// OnFire is called after fires were written (the relay's Notify), from
	// any goroutine; it must not block.
	OnFire func()
	// OnOutcome, when set, hears the outcome of every fire attempt and of
	// every failed watermark read (a stall detector's reasons), on the
	// loop goroutine; it must not block.
	OnOutcome func(schedule.Outcome)
	// Visibility is how often asynq's scheduler entries are rewritten.
	Visibility time.Duration
	// History, when set, tells which queues an entry used before its
	// current one, so a replica that did not see a queue change live still
	// closes the old queue before firing (NewStreamHistory). With Shards it
	// is needed for exactly-once: an entry that changes queue changes
	// shard, its new owner is usually another replica, and without the
	// history that owner neither closes the old queue (whose owner may
	// still fire the tick there) nor finds the ticks due since the
	// change's floor. It reads the history only of entries whose subject
	// holds more than their registration.
	History History
	Logger  *slog.Logger
	Metrics *Metrics

	// RestoreSettle is how long a restore proposal for a watermark Redis
	// lost waits for every live replica to add its position before it
	// seeds the watermark (DefaultRestoreSettle).
	RestoreSettle time.Duration

	// Broker, when set, is used instead of a Store on Redis (simulations,
	// fault injection); Redis may then be nil.
	Broker Broker
}

// Scheduler is one replica's firing loop.
type Scheduler struct {
	cfg    Config
	broker Broker
	log    *slog.Logger
	clock  *Clock
	m      *Metrics
	src    string // events' source

	// Owned by the loop goroutine. entries holds the run of every entry
	// this replica knows, in its state (machine.go); heap and loading
	// index the runs that are due and those whose watermark is to be
	// read, and removedRuns counts the removed ones, all kept by the
	// state machine's enter.
	entries     map[string]*entryRun
	heap        dueHeap
	loading     map[string]*entryRun
	removedRuns int
	// loadAfter delays the next watermark load after a failed one. It,
	// visSince and the other clock.Mono fields measure durations
	// (backoffs, rechecks); they are never compared with ticks, which use
	// the corrected clock.Now.
	loadAfter clock.Mono
	loadFails int
	// visWritten: asynq's scheduler entries were written once since start.
	visWritten bool
	// hist caches History's answers about all entries.
	hist historyCache
	// bounded is cfg.History (nil without one), for the reads run off the
	// loop (lastFires).
	bounded *boundedHistory
	// Config sequences that refused fires, to check against the stream,
	// and those found in it (epoch.go).
	epochSuspects map[epochSuspect]bool
	epochChecked  map[epochSuspect]clock.Mono
	// configID is the id of the config message at the sequence the fires
	// of the current pass present (sendPass).
	configID string

	// sub is the projection's subscription (its Snapshot builds the runs
	// of a shard taken over); owned the shards whose runs the loop holds,
	// and marks, per owned shard, the last batch of changes its snapshot
	// supersedes (owned.go).
	sub   *projector.Subscription
	owned OwnedShards
	marks map[events.Shard]uint64
	// backlog holds, per queue, entries due that a pass over its budget
	// left for the next (fairShare); fairNext is the queue the next such
	// pass starts at.
	backlog  map[string]*queueBacklog
	fairNext int

	timesReq chan chan []entryTimes // a scrape's request for listEntryTimes
	idle     chan chan struct{}     // WaitIdle's requests
	loopDone chan struct{}          // closed when the loop has returned
	wake     chan struct{}
	history  chan []taskstate.EnqueueEventRecord // to writeHistory
	// historyHeld: asynq enqueue history records of the passes, kept
	// since historyHeldSince, for flushHistory (loop goroutine only).
	historyHeld      []taskstate.EnqueueEventRecord
	historyHeldSince clock.Mono
	// farOff: passes of a burst whose far-off plans are still to apply
	// (placeFarOff; loop goroutine only).
	farOff []farOffPass
	vis    chan []taskstate.SchedulerEntry // to writeVisibilityLoop
	// tickText's memo (loop goroutine only).
	lastTick     time.Time
	lastTickText string
	// visPending: a visibility write is due since visSince (loop-owned).
	visPending bool
	visSince   clock.Mono
	rooms      []passRoom   // batches' buffers for the next passes (takeRoom)
	sents      [][]sentFire // applied batches' fires, for the next (takeSent)
	// firedData holds the fired records' data of the last plan (see
	// firedRecord; loop goroutine only).
	firedData []byte
	held      heldCheck // overlap buffer-one's release check (held.go)

	// pos: the entries' positions, for raiseProposals.
	pos positions

	capacity capacityMeter // what this replica has shown it can fire
	missed   missedTally   // the entries whose ticks a pass recorded missed

	paused atomic.Bool // outbox backpressure
	fenced fenced      // a run of fence refusals (Fenced)
	busy   atomic.Bool // firing more than one batch, or a backlog left
	// firingSince is when the fire pass in progress began (monotonic,
	// after epoch; 0: none in progress).
	epoch       clock.Mono
	firingSince atomic.Int64
	life        lifecycle.Lifecycle
}

// New returns a scheduler; Start runs it.
func New(cfg Config) (*Scheduler, error) {
	if (cfg.Redis == nil && cfg.Broker == nil) || cfg.Projection == nil {
		return nil, errors.New("scheduler: Redis and Projection are required")
	}
	if cfg.ReplicaID == "" {
		return nil, errors.New("scheduler: ReplicaID is required")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.MaxStaleness <= 0 {
		cfg.MaxStaleness = DefaultMaxStaleness
	}
	if cfg.MaxCatchup <= 0 {
		cfg.MaxCatchup = DefaultMaxCatchup
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.Visibility <= 0 {
		cfg.Visibility = DefaultVisibility
	}
	if cfg.RestoreSettle <= 0 {
		cfg.RestoreSettle = DefaultRestoreSettle
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Local()
	}
	var bounded *boundedHistory
	if cfg.History != nil {
		bounded = &boundedHistory{h: cfg.History, clock: clk, log: cfg.Logger}
		cfg.History = bounded
	}
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	b := cfg.Broker
	if b == nil {
		b = taskstate.New(cfg.Redis)
	}
	return &Scheduler{
		cfg: cfg, broker: b, log: cfg.Logger, clock: clk, m: m, src: events.ReplicaSource(cfg.ReplicaID), bounded: bounded,
		entries:  map[string]*entryRun{},
		loading:  map[string]*entryRun{},
		capacity: capacityMeter{log: cfg.Logger},
		timesReq: make(chan chan []entryTimes),
		idle:     make(chan chan struct{}),
		loopDone: make(chan struct{}),
		history:  make(chan []taskstate.EnqueueEventRecord, 16),
		vis:      make(chan []taskstate.SchedulerEntry, 1),
		wake:     make(chan struct{}, 1),
		epoch:    clk.Mono(),
		pos:      positions{now: clk.Now},
	}, nil
}

// Start waits until the projection is caught up (so the first fires use a
// configuration at least as new as the stream's at start) and runs the
// loop until Stop. Start and Stop follow the rules of package lifecycle
// (a second Start returns ErrAlreadyStarted, a Start after Stop
// ErrStopped).
func (s *Scheduler) Start(ctx context.Context) error {
	err := s.life.Start(ctx, func(ctx context.Context) error {
		if err := s.cfg.Projection.WaitCaughtUp(ctx); err != nil {
			return fmt.Errorf("wait for the projection: %w", err)
		}
		sub := s.cfg.Projection.Subscribe()
		s.sub = sub
		var removed []projector.Change
		if s.ownsAll() {
			// With ownership, a shard's removals come with it (takeShards).
			removed = sub.Removed()
		}
		changes := make(chan projector.Batch)
		s.life.Go(func(ctx context.Context) { sub.Pump(ctx, changes) })
		s.life.Go(func(ctx context.Context) {
			defer close(s.history) // the loop is its only sender
			defer close(s.vis)     // likewise
			defer close(s.loopDone)
			s.loop(ctx, changes, removed)
			s.busy.Store(false)
			s.placeFarOff()
			s.sendHistory(s.historyHeld)
		})
		s.life.Go(func(context.Context) { s.writeHistory() })
		s.life.Go(func(context.Context) { s.writeVisibilityLoop() })
		s.life.Go(s.raiseProposals)
		return nil
	})
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	return nil
}

// Stop stops the loop and waits for it; there is nothing to drain, so ctx
// is not waited on. A batch in flight is cancelled: its outcome is
// unknown, which is safe (every fire is one atomic, idempotent step;
// whichever replica fires next sees the watermark).
func (s *Scheduler) Stop(context.Context) error {
	s.life.Stop()
	return nil
}

// Busy reports whether the scheduler is firing a burst (more due fires
// than one batch, until no backlog of them is left). The relay's Hold
// takes it, so a burst gets the cores and Redis first and its events
// follow right after.
func (s *Scheduler) Busy() bool { return s.busy.Load() }

// Firing returns how long the fire pass in progress has been waiting for
// its fires to return (0: none in progress). A stall detector reads it: a
// pass that hangs on Redis produces no outcome.
func (s *Scheduler) Firing() time.Duration {
	since := s.firingSince.Load()
	if since == 0 {
		return 0
	}
	return max(s.clock.Since(s.epoch)-time.Duration(since), 0)
}

// WaitIdle returns once the firing loop has finished the turn it was in
// and waits for its next event, or with ctx's error. A simulation on a
// manual clock calls it before moving the clock on, so the loop acts on
// each instant before the next one comes.
func (s *Scheduler) WaitIdle(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case s.idle <- done:
	case <-s.loopDone:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errStopped is WaitIdle's error once the loop has returned.
var errStopped = errors.New("scheduler: the firing loop has stopped")

// Paused reports whether firing is paused by outbox backpressure.
func (s *Scheduler) Paused() bool { return s.paused.Load() }

func (s *Scheduler) loop(ctx context.Context, changes <-chan projector.Batch, removed []projector.Change) {
	for _, c := range removed {
		s.foundRemoved(c)
	}
	var shardsChanged <-chan struct{}
	if !s.ownsAll() {
		shardsChanged = s.cfg.Shards.Changed()
	}
	timer := s.clock.NewTimer(time.Hour)
	defer timer.Stop()
	vis := s.clock.NewTicker(s.cfg.Visibility)
	defer vis.Stop()
	var due []*entryRun
	// armed is when the timer fires (zero: it fired). A turn that only
	// takes a message (a change, an observation, a visibility tick) keeps
	// an earlier deadline: re-arming it a full wait ahead at every message
	// would starve the pass while messages come more often than that.
	var armed clock.Mono
	for {
		wait := s.nextWait()
		if at := s.clock.Mono().Add(wait); armed.IsZero() || at.Before(armed) {
			timer.Reset(wait)
			armed = at
		}
		// A message that reads or changes runs first places a burst's
		// far-off entries (placeFarOff): it then meets every run as
		// applied.
		select {
		case <-ctx.Done():
			return
		case done := <-s.idle:
			close(done)
			continue
		case b, ok := <-changes:
			if !ok {
				if ctx.Err() == nil {
					s.log.Error("the projection stopped: this replica no longer fires")
				}
				return
			}
			s.placeFarOff()
			for _, c := range b.Changes {
				s.follow(c, b.Mark)
			}
			continue // re-arm; loading and firing happen on the next turn
		case <-shardsChanged:
			// Taken and dropped at once, loaded and fired in the turn.
		case reply := <-s.timesReq:
			s.placeFarOff()
			reply <- s.listEntryTimes()
			continue
		case <-vis.C:
			if !s.visPending {
				s.visPending, s.visSince = true, s.clock.Mono()
			}
			s.maybeWriteVisibility(false)
			continue
		case <-s.wake:
		case <-timer.C:
			armed = clock.Mono{}
		}
		due = s.turn(ctx, due)
	}
}

// nextWait is how long the loop may wait for its next turn: until the
// first due entry, the next load, the next held-tick check, at most a
// second (the clock's offset to Redis may change at a heartbeat, and a
// timer armed on the old offset would fire late), and not at all while a
// backlog waits.
func (s *Scheduler) nextWait() time.Duration {
	wait := time.Second
	if at, ok := s.heap.peek(); ok {
		wait = min(max(at.Sub(s.clock.Now()), 0), wait)
	}
	if len(s.loading) > 0 {
		wait = min(wait, max(s.clock.Until(s.loadAfter), 0))
	}
	wait = min(wait, max(s.clock.Until(s.held.wakeAt()), 0))
	if len(s.backlog) > 0 {
		wait = 0 // the next pass takes the backlog
	}
	return wait
}

// turn is the loop's work after a wake: follow the shards, load
// watermarks, fire what is due, release held ticks. due is scratch
// storage for the due entries, returned for the next turn.
func (s *Scheduler) turn(ctx context.Context, due []*entryRun) []*entryRun {
	// The runs of shards taken and dropped since the last turn; the turn
	// is the loop's progress, and no fire of a shard dropped is in flight
	// any more (its lease may go).
	s.followShards()
	if !s.ownsAll() {
		s.cfg.Shards.Turned(s.owned.Version)
	}
	if len(s.loading) > 0 && (!s.clock.Mono().Before(s.loadAfter) || s.hist.fires.ended()) {
		s.loadWatermarks(ctx)
		if len(s.loading) == 0 && !s.visWritten {
			// Make the entries visible to asynq's tools at once, not only
			// after the first Visibility period.
			s.visWritten = true
			// As if pending for half a period: written now when quiet,
			// else right after the next pass of fires.
			s.visPending, s.visSince = true, s.clock.Mono().Add(-s.cfg.Visibility/2)
			s.maybeWriteVisibility(false)
		}
	}
	if s.backpressured() {
		// Try again shortly; nothing is lost, ticks become late and then
		// follow the catch-up policy like any outage.
		if at, ok := s.heap.peek(); ok && !at.After(s.clock.Now()) {
			for _, e := range s.heap.popDue(s.clock.Now(), due[:0]) {
				s.heap.set(e, s.clock.Now().Add(500*time.Millisecond))
			}
		}
		s.requeueBacklog(s.clock.Now().Add(500 * time.Millisecond))
		s.placeFarOff()
		s.busy.Store(false) // the relay is what firing waits for
		return due
	}
	due = s.heap.popDue(s.clock.Now(), due[:0])
	if due = s.fairShare(s.leased(due)); len(due) > 0 {
		s.firePasses(ctx, due)
		s.checkEpochs(ctx)
		s.maybeWriteVisibility(true)
	}
	// A burst's backlog is fired in the turns that follow at once: the
	// scheduler is busy (Busy, which the relay waits for) until the last of
	// them, not free for a moment at every turn's end.
	s.busy.Store(len(s.backlog) > 0)
	if len(s.backlog) == 0 {
		s.placeFarOff()
	}
	s.flushHistory()
	s.releaseHeld(ctx)
	s.setEntriesGauge()
	return due
}

func (s *Scheduler) backpressured() bool {
	if s.cfg.OutboxBytes == nil || s.cfg.MaxOutboxBytes <= 0 {
		return false
	}
	over := s.cfg.OutboxBytes() > s.cfg.MaxOutboxBytes
	if s.paused.Swap(over) != over {
		if over {
			s.log.Warn("outbox backlog over the bound: firing paused until the relay catches up", "max_outbox_bytes", s.cfg.MaxOutboxBytes)
		} else {
			s.log.Info("outbox backlog back under the bound: firing resumed")
		}
		s.m.Backpressure.Set(boolGauge(over))
	}
	return over
}
