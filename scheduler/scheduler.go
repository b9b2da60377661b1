// Package scheduler fires every registered entry's ticks into Redis as asynq
// tasks, exactly once across any number of replicas (docs/design.md "Why
// each tick fires exactly once").
//
// It owns fire-time computation (Schedule), the firing loop (one timer over a
// min-heap of due instants), catch-up after outages, the primary/late split
// between replicas, manual triggers and backfills. It never decides alone
// that a tick may fire: every fire is one atomic taskstate script that
// compares-and-sets the entry's watermark and checks the revision and
// staleness fences, so two replicas can never both fire one tick. It never
// publishes to NATS: fired and skipped events go into the Redis outbox in
// the same step as the task, and the relay publishes them. It reads the
// streams only through History: an entry's earlier queues (to close them
// before firing into a new one) and its last fire (to restore a watermark
// Redis lost).
package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/taskstate"
)

// Broker is the scheduler's seam to Redis; *taskstate.Store implements it.
type Broker interface {
	FireBatch(ctx context.Context, fires []taskstate.Fire) ([]taskstate.FireResult, error)
	Watermarks(ctx context.Context, prefix, queue string, entries []string) ([]taskstate.WatermarkInfo, error)
	CloseForHandover(ctx context.Context, prefix, oldQueue, entry string, revision uint64) (time.Time, string, bool, error)
	SeedWatermark(ctx context.Context, prefix, newQueue, entry string, tick time.Time, taskID string, revision uint64) error
	ClearFence(ctx context.Context, prefix, queue string, seq uint64) (bool, error)
	ClearHandover(ctx context.Context, prefix, queue, entry string, revision uint64) (bool, error)
	WriteSchedulerEntries(ctx context.Context, schedulerID string, entries []taskstate.SchedulerEntry, ttl time.Duration) error
	RecordSchedulerEnqueueEvents(ctx context.Context, events []taskstate.EnqueueEventRecord) error
}

// Projection is what the scheduler reads of the live projection;
// *projector.Projector implements it.
type Projection interface {
	Subscribe() *projector.Subscription
	LastSeq() uint64
	// ConfigMessageID is events.ConfigMessageID of the message at seq, ""
	// when not known (seq is not the last applied).
	ConfigMessageID(seq uint64) string
	LastHeard() time.Time
	WaitCaughtUp(ctx context.Context) error
}

// Members tells which replicas are live, for the primary of each entry.
type Members interface {
	Live() []string
}

// Defaults, each overridable in Config.
const (
	DefaultGrace        = 5 * time.Second
	DefaultLateDelay    = 2 * time.Second
	DefaultMaxStaleness = 30 * time.Second
	DefaultMaxCatchup   = 100
	DefaultBatch        = 1000
	DefaultParallel     = 4
	DefaultVisibility   = 10 * time.Second
)

// Config configures a Scheduler. Zero values mean the defaults.
type Config struct {
	Broker     Broker
	Projection Projection
	Members    Members // nil: this replica is primary for everything
	Names      events.Names
	ReplicaID  string
	Clock      *Clock // nil: the local clock, uncorrected
	// Grace: a tick counts as missed (and goes to the catch-up policy) only
	// once it is older than this.
	Grace time.Duration
	// LateDelay: a replica that is not an entry's primary fires a tick only
	// once it is this late.
	LateDelay time.Duration
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
	OnOutcome func(Outcome)
	// Visibility is how often asynq's scheduler entries are rewritten.
	Visibility time.Duration
	// History, when set, tells which queues an entry used before its
	// current one, so a replica that did not see a queue change live still
	// closes the old queue before firing (NewStreamHistory). It reads the
	// history only of entries whose subject holds more than their
	// registration.
	History History
	Logger  *slog.Logger
	Metrics *Metrics
}

// Outcome is what became of one attempt to handle an entry's tick.
type Outcome struct {
	Entry string
	// Tick is zero when no tick was attempted (the watermark could not be
	// read).
	Tick   time.Time
	Status taskstate.FireStatus // zero when Err is set
	Err    error
}

// Scheduler is one replica's firing loop.
type Scheduler struct {
	cfg   Config
	log   *slog.Logger
	clock *Clock
	m     *Metrics
	src   string // events' source

	// Owned by the loop goroutine.
	entries map[string]*entryRun
	heap    dueHeap
	load    map[string]*entryRun // entries whose watermark must be read
	// pausedEntries holds the paused entries, so asynq's scheduler entries list
	// them marked paused (visibilitySnapshot); they never fire.
	pausedEntries map[string]projector.State
	// loadAfter delays the next watermark load after a failed one. It
	// and visSince are local monotonic times (backoffs), never compared
	// with ticks, which use the corrected clock.
	loadAfter time.Time
	loadFails int
	live      []string
	// visWritten: asynq's scheduler entries were written once since start.
	visWritten bool
	// hist caches History's answers about all entries.
	hist historyCache
	// Config sequences that refused fires, to check against the stream,
	// and those found in it (epoch.go).
	epochSuspects map[epochSuspect]bool
	epochChecked  map[epochSuspect]time.Time
	// configID is the id of the config message at the sequence the fires
	// of the current pass present (fireDue).
	configID string

	observed chan observation
	timesReq chan chan []entryTimes // a scrape's request for listEntryTimes
	wake     chan struct{}
	history  chan []taskstate.EnqueueEventRecord // to writeHistory
	vis      chan []taskstate.SchedulerEntry     // to writeVisibilityLoop
	// tickText's memo (loop goroutine only).
	lastTick     time.Time
	lastTickText string
	// visPending: a visibility write is due since visSince (loop-owned).
	visPending bool
	visSince   time.Time
	fireBufs   [][]taskstate.Fire // see fireBuf

	// implausibleLogged: when an implausible observation was last logged.
	implausibleLogged time.Time

	mu    sync.Mutex
	stats Stats

	paused atomic.Bool // outbox backpressure
	busy   atomic.Bool // firing more than one batch
	// firingSince is when the fire pass in progress began (monotonic,
	// after epoch; 0: none in progress).
	epoch       time.Time
	firingSince atomic.Int64
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	started     atomic.Bool
}

// Stats are counters for status and tests.
type Stats struct {
	Fired, AlreadyExisted, SkippedMissed, SkippedOverlap, SkippedUnique uint64
	SkippedExcluded                                                     uint64
	Refused                                                             map[string]uint64
	Errors                                                              uint64
	Entries                                                             int
	// Loading counts entries not firing yet because their watermark is
	// still to be read (after a start, a queue change or a re-register).
	Loading int
	// Implausible counts fires heard on the activity subjects for a tick
	// far ahead of the clock (forged, or from a publisher with a broken
	// clock); they are ignored.
	Implausible uint64
	// Epochs counts fences and markers of an earlier config stream this
	// replica cleared (new stream epochs).
	Epochs uint64
}

// entryRun is the scheduler's state of one registered entry.
type entryRun struct {
	id    string
	st    projector.State
	sched *Schedule
	queue string

	// cursor is the entry's last handled (fired or skipped) tick in its
	// queue, as last known; known says whether it was read from Redis or
	// learned from a fire.
	cursor    time.Time
	hasCursor bool
	known     bool
	lastTask  string

	// handled is the last tick this replica knows the watermark held: read
	// from Redis or written by its own fire (cursor may come from observed
	// events, backfills among them, which prove nothing of the watermark).
	// A watermark found missing or older than it means Redis lost data; it
	// is kept to restore the watermark then.
	handled    time.Time
	hasHandled bool
	// floor: ticks at or before it are never fired (they belong to a pause
	// or to an earlier spec).
	floor time.Time
	// floorAtLoad: floor is the entry's last config time as found at
	// start, not a schedule change seen live (see scheduleSince).
	floorAtLoad bool
	// fromQueue is a queue the entry must be closed in before it fires in
	// queue (a queue change seen live).
	fromQueue string
	// reopen: the entry's queue slot was found closed by an older handover
	// (the entry moved away and back); it is reopened from the history.
	reopen bool
	// restored: a lost watermark was looked for in the activity stream.
	restored bool
	// heard is a tick a fire of which was heard on the activity subjects
	// while it was the entry's next: a hint only (see applyObservation).
	heard time.Time

	due   time.Time
	index int
	tries int // consecutive refusals/errors, for backoff
	// recorded counts asynq history events written for the entry; its
	// history is trimmed on every historyTrimEvery-th.
	recorded uint32

	// The last Next computed: schedule computes the tick after start,
	// and plan needs the same one when it comes due.
	memoSched    *Schedule
	memoFrom     time.Time
	memoNext     time.Time
	memoComputed bool
}

// next returns r's first tick after start() (zero when none).
func (r *entryRun) next() time.Time {
	from := r.start()
	if !r.memoComputed || r.memoSched != r.sched || !r.memoFrom.Equal(from) {
		r.memoSched, r.memoFrom, r.memoNext, r.memoComputed = r.sched, from, r.sched.Next(from), true
	}
	return r.memoNext
}

// historyTrimEvery: an entry's asynq enqueue history is trimmed to asynq's
// 1,000 events on every 16th event this replica records for it (and on the
// first), so it holds at most 15 more per replica between trims.
const historyTrimEvery = 16

type observation struct {
	entry string
	tick  time.Time
}

// New returns a scheduler; Start runs it.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Broker == nil || cfg.Projection == nil {
		return nil, errors.New("scheduler: Broker and Projection are required")
	}
	if cfg.ReplicaID == "" {
		return nil, errors.New("scheduler: ReplicaID is required")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.LateDelay <= 0 {
		cfg.LateDelay = DefaultLateDelay
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
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	clock := cfg.Clock
	if clock == nil {
		clock = NewClock(func(context.Context) (time.Time, error) { return time.Now(), nil })
	}
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Scheduler{
		cfg: cfg, log: cfg.Logger, clock: clock, m: m, src: events.ReplicaSource(cfg.ReplicaID),
		entries:  map[string]*entryRun{},
		load:     map[string]*entryRun{},
		observed: make(chan observation, 4096),
		timesReq: make(chan chan []entryTimes),
		history:  make(chan []taskstate.EnqueueEventRecord, 16),
		vis:      make(chan []taskstate.SchedulerEntry, 1),
		wake:     make(chan struct{}, 1),
		stats:    Stats{Refused: map[string]uint64{}},
		epoch:    time.Now(),
	}, nil
}

// Start waits until the projection is caught up (so the first fires use a
// configuration at least as new as the stream's at start) and runs the
// loop until Stop.
func (s *Scheduler) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("scheduler already started")
	}
	if err := s.cfg.Projection.WaitCaughtUp(ctx); err != nil {
		return fmt.Errorf("scheduler: wait for the projection: %w", err)
	}
	sub := s.cfg.Projection.Subscribe()
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	changes := make(chan []projector.Change)
	s.wg.Add(4)
	go func() {
		defer s.wg.Done()
		defer close(changes)
		defer sub.Close()
		for {
			batch, err := sub.Next(lctx)
			if err != nil {
				return
			}
			select {
			case changes <- batch:
			case <-lctx.Done():
				return
			}
		}
	}()
	go func() {
		defer s.wg.Done()
		defer close(s.history) // the loop is its only sender
		defer close(s.vis)     // likewise
		s.loop(lctx, changes)
	}()
	go func() {
		defer s.wg.Done()
		s.writeHistory()
	}()
	go func() {
		defer s.wg.Done()
		s.writeVisibilityLoop()
	}()
	return nil
}

// Stop stops the loop and waits for it. A batch in flight is cancelled:
// its outcome is unknown, which is safe (every fire is one atomic,
// idempotent step; whichever replica fires next sees the watermark).
func (s *Scheduler) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
}

// Observe tells the scheduler another replica handled (fired or skipped)
// entry's tick, so its attempt at that tick reads the watermark before it
// fires (see applyObservation). It never blocks: when the buffer is full
// the observation is dropped and the fire attempt's compare-and-set sorts
// it out.
func (s *Scheduler) Observe(entry string, tick time.Time) {
	select {
	case s.observed <- observation{entry, tick}:
	default:
	}
}

// ObserveActivity is Observe for a message heard on the fire subjects of
// the activity stream, by its subject and Nats-Msg-Id. Whoever may publish
// there can send one, so it is a hint and nothing more; an id naming
// another entry than its subject does is ignored.
func (s *Scheduler) ObserveActivity(subject, msgID string) {
	if entry, tick, ok := ParseActivityID(msgID); ok && subject == s.cfg.Names.FireSubject(entry) {
		s.Observe(entry, tick)
	}
}

// ObserveRecords is Observe for each fired or skipped event among outbox
// records a relay has published (relay.Config.OnPublished).
func (s *Scheduler) ObserveRecords(recs []taskstate.OutboxRecord) {
	for _, rec := range recs {
		if entry, tick, ok := ParseActivityID(rec.EventID); ok {
			s.Observe(entry, tick)
		}
	}
}

// Busy reports whether the scheduler is firing a burst (more due fires
// than one batch). The relay's Hold takes it, so a burst gets the cores and
// Redis first and its events follow right after.
func (s *Scheduler) Busy() bool { return s.busy.Load() }

// Firing returns how long the fire pass in progress has been waiting for
// its fires to return (0: none in progress). A stall detector reads it: a
// pass that hangs on Redis produces no outcome.
func (s *Scheduler) Firing() time.Duration {
	since := s.firingSince.Load()
	if since == 0 {
		return 0
	}
	return max(time.Since(s.epoch)-time.Duration(since), 0)
}

// Paused reports whether firing is paused by outbox backpressure.
func (s *Scheduler) Paused() bool { return s.paused.Load() }

// Stats returns a copy of the counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.stats
	c.Refused = make(map[string]uint64, len(s.stats.Refused))
	for k, v := range s.stats.Refused {
		c.Refused[k] = v
	}
	return c
}

func (s *Scheduler) loop(ctx context.Context, changes <-chan []projector.Change) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	vis := time.NewTicker(s.cfg.Visibility)
	defer vis.Stop()
	var due []*entryRun
	for {
		// Arm the timer for the first due entry, at most a second ahead:
		// the clock's offset to Redis may change at a heartbeat, and a timer
		// armed on the old offset would fire late.
		wait := time.Second
		if at, ok := s.heap.peek(); ok {
			wait = min(max(at.Sub(s.clock.Now()), 0), wait)
		}
		if len(s.load) > 0 {
			wait = min(wait, max(time.Until(s.loadAfter), 0))
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case batch, ok := <-changes:
			if !ok {
				if ctx.Err() == nil {
					s.log.Error("the projection stopped: this replica no longer fires")
				}
				return
			}
			for _, c := range batch {
				s.applyChange(c)
			}
			continue // re-arm; loading and firing happen on the next turn
		case o := <-s.observed:
			// Observations come in bursts (every fire of the other
			// replicas): take what is buffered in one turn.
			s.applyObservation(o)
			for more := true; more; {
				select {
				case o := <-s.observed:
					s.applyObservation(o)
				default:
					more = false
				}
			}
			continue
		case reply := <-s.timesReq:
			reply <- s.listEntryTimes()
			continue
		case <-vis.C:
			if !s.visPending {
				s.visPending, s.visSince = true, time.Now()
			}
			s.maybeWriteVisibility(false)
			continue
		case <-s.wake:
		case <-timer.C:
		}
		s.live = s.liveReplicas()
		if len(s.load) > 0 && !time.Now().Before(s.loadAfter) {
			s.loadWatermarks(ctx)
			if len(s.load) == 0 && !s.visWritten {
				// Make the entries visible to asynq's tools at once, not
				// only after the first Visibility period.
				s.visWritten = true
				// As if pending for half a period: written now when
				// quiet, else right after the next pass of fires.
				s.visPending, s.visSince = true, time.Now().Add(-s.cfg.Visibility/2)
				s.maybeWriteVisibility(false)
			}
		}
		if s.backpressured() {
			// Try again shortly; nothing is lost, ticks become late and
			// then follow the catch-up policy like any outage.
			if at, ok := s.heap.peek(); ok && !at.After(s.clock.Now()) {
				for _, e := range s.heap.popDue(s.clock.Now(), due[:0]) {
					s.heap.set(e, s.clock.Now().Add(500*time.Millisecond))
				}
			}
			continue
		}
		due = s.heap.popDue(s.clock.Now(), due[:0])
		if len(due) > 0 {
			s.fireDue(ctx, due)
			s.checkEpochs(ctx)
			s.maybeWriteVisibility(true)
		}
		s.setEntriesGauge()
	}
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

func (s *Scheduler) liveReplicas() []string {
	if s.cfg.Members == nil {
		return []string{s.cfg.ReplicaID}
	}
	live := s.cfg.Members.Live()
	if len(live) == 0 {
		return []string{s.cfg.ReplicaID}
	}
	return live
}

// applyChange follows the projection: entries join, change, pause, leave.
func (s *Scheduler) applyChange(c projector.Change) {
	r := s.entries[c.ID]
	if c.New != nil && c.New.Entry.Paused {
		if s.pausedEntries == nil {
			s.pausedEntries = map[string]projector.State{}
		}
		s.pausedEntries[c.ID] = *c.New
	} else {
		delete(s.pausedEntries, c.ID)
	}
	if c.New == nil || c.New.Entry.Paused {
		if r != nil {
			s.heap.remove(r)
			delete(s.load, r.id)
			if c.New == nil {
				delete(s.entries, c.ID)
			} else {
				r.st = *c.New
			}
		}
		return
	}
	st := *c.New
	sched, err := NewSchedule(st.Entry)
	if err != nil {
		// The projector validated the entry; this is a bug, not bad input.
		s.log.Error("entry has no usable schedule; not firing it", "entry", c.ID, "err", err)
		if r != nil {
			s.heap.remove(r)
			delete(s.entries, c.ID)
		}
		return
	}
	if r == nil {
		r = &entryRun{id: c.ID, index: -1, floor: st.Time, floorAtLoad: true}
		s.entries[c.ID] = r
	} else {
		old := r.st.Entry
		switch {
		case old.Paused:
			// Ticks while paused are not missed: they never fire.
			r.floor, r.floorAtLoad = st.Time, false
		case old.Cron != st.Entry.Cron || old.Timezone != st.Entry.Timezone:
			// A new spec never fires ticks of the old one, nor its own
			// ticks from before the change.
			r.floor, r.floorAtLoad = st.Time, false
		}
		if q := st.Entry.Options.QueueName(); q != r.queue && r.queue != "" {
			r.fromQueue = r.queue
			r.known = false
		}
	}
	r.st, r.sched, r.queue = st, sched, st.Entry.Options.QueueName()
	r.tries = 0
	if !r.known {
		s.heap.remove(r)
		s.load[r.id] = r
		return
	}
	s.schedule(r, s.clock.Now())
}

// applyObservation takes a fire heard from elsewhere as a hint that never
// moves the entry's cursor: anyone allowed to publish on the activity
// subjects could otherwise make every replica skip ticks. Heard for the
// tick the entry is to fire next, it makes this replica's attempt at that
// tick read the watermark first (confirmHeard); any other tick is ignored,
// and one far ahead of the clock is counted and logged as implausible.
func (s *Scheduler) applyObservation(o observation) {
	r := s.entries[o.entry]
	if r == nil {
		return
	}
	if ahead := o.tick.Sub(s.clock.Now()); ahead > implausibleAhead {
		s.count(func(st *Stats) { st.Implausible++ })
		s.m.Implausible.Inc()
		if time.Since(s.implausibleLogged) >= time.Minute {
			s.implausibleLogged = time.Now()
			s.log.Warn("ignoring a fire heard for a tick far ahead of the clock: forged, or published by a replica with a wrong clock (logged once a minute, counted in cronstream_scheduler_implausible_observations_total)",
				"entry", r.id, "tick", o.tick.UTC().Format(time.RFC3339), "ahead", ahead.Round(time.Second))
		}
		return
	}
	if r.known && o.tick.Equal(r.next()) {
		r.heard = o.tick
	}
}

// implausibleAhead is how far ahead of the scheduler's clock a heard tick
// is taken as implausible: no replica fires a tick before it is due, and
// the replicas' clocks are corrected to Redis's.
const implausibleAhead = time.Minute

// confirmHeard reads, per queue in one round trip, the watermark of the
// due entries whose due tick was heard fired, instead of firing them. A
// watermark at or past that tick (only the fire script writes it) becomes
// the cursor and the entry waits for its next tick; every other entry is
// returned, in due's storage, to be fired now, so a heard fire costs a
// non-primary one read and never a tick.
func (s *Scheduler) confirmHeard(ctx context.Context, due []*entryRun) []*entryRun {
	var heard map[string][]*entryRun
	keep := due[:0]
	for _, r := range due {
		if !r.heard.IsZero() && r.heard.Equal(r.next()) {
			if heard == nil {
				heard = map[string][]*entryRun{}
			}
			heard[r.queue] = append(heard[r.queue], r)
			continue
		}
		r.heard = time.Time{}
		keep = append(keep, r)
	}
	now := s.clock.Now()
	for q, runs := range heard {
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.id
		}
		wms, err := s.cfg.Broker.Watermarks(ctx, s.cfg.Names.Prefix(), q, ids)
		if err == nil && len(wms) != len(ids) {
			err = fmt.Errorf("%d watermarks for %d entries", len(wms), len(ids))
		}
		for i, r := range runs {
			tick := r.heard
			r.heard = time.Time{}
			if err != nil || !wms[i].OK || wms[i].Tick.Before(tick) {
				keep = append(keep, r) // the fire's compare-and-set decides
				continue
			}
			r.cursor, r.hasCursor, r.lastTask, r.tries = wms[i].Tick, true, wms[i].TaskID, 0
			s.schedule(r, now)
		}
	}
	return keep
}

// loadWatermarks reads the watermark of every entry that needs one, per
// queue in one round trip, doing queue handovers first. Entries whose load
// failed stay in s.load and are retried after a backoff.
func (s *Scheduler) loadWatermarks(ctx context.Context) {
	prefix := s.cfg.Names.Prefix()
	byQueue := map[string][]*entryRun{}
	failed, later := false, false
	for _, r := range s.load {
		if r.fromQueue != "" {
			if _, err := s.handover(ctx, r, []string{r.fromQueue}); err != nil {
				// Firing into the new queue before the old one is closed
				// could fire a tick in both: wait.
				failed = true
				continue
			}
		}
		byQueue[r.queue] = append(byQueue[r.queue], r)
	}
	now := s.clock.Now()
	var restored []string
	for q, runs := range byQueue {
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.id
		}
		wms, err := s.cfg.Broker.Watermarks(ctx, prefix, q, ids)
		if err != nil {
			s.countError()
			s.log.Warn("read watermarks", "queue", q, "entries", len(ids), "err", err)
			for _, r := range runs {
				s.outcome(Outcome{Entry: r.id, Err: err})
			}
			failed = true
			continue // stay in s.load; retried after a backoff
		}
		for i, r := range runs {
			wm := wms[i]
			// A missing watermark, or one older than a tick known to be
			// handled, is restored (once per load: the stream may hold
			// nothing usable), after the handover that closes the entry's
			// other queues: the restore opens this one.
			restoreNow := !r.restored && (!wm.OK || s.behind(ctx, r, wm.Tick, now))
			reread := false
			if !wm.OK || r.reopen || restoreNow {
				prev, err := s.previousQueues(ctx, r)
				if err != nil {
					later = true
					continue
				}
				if len(prev) > 0 || r.reopen {
					seeded, err := s.handover(ctx, r, prev)
					if err != nil {
						failed = true
						continue
					}
					if r.reopen || seeded {
						r.reopen = false
						reread = true // the watermark changed: read it again next turn
					}
				}
			}
			if restoreNow {
				r.restored = true
				if s.restore(ctx, r) {
					restored = append(restored, r.id)
					reread = true
				}
			}
			if reread {
				continue
			}
			// Only when a tick of its schedule fell between the watermark
			// and the last config change does the floor matter (and the
			// history get read): a daily entry edited after its last fire
			// needs nothing.
			if r.floorAtLoad && wm.OK && wm.Tick.Before(r.floor) && !r.sched.Next(wm.Tick).After(r.floor) {
				since, err := s.scheduleSince(ctx, r)
				if err != nil {
					later = true
					continue
				}
				r.floor = since
			}
			r.floorAtLoad = false
			delete(s.load, r.id)
			r.known, r.restored = true, false
			r.cursor, r.hasCursor, r.lastTask = wm.Tick, wm.OK, wm.TaskID
			r.handled, r.hasHandled = wm.Tick, wm.OK
			if r.st.Entry.Paused {
				continue
			}
			s.schedule(r, now)
		}
	}
	if len(restored) > 0 {
		s.log.Warn("watermarks missing in Redis or older than ticks known to be handled (did Redis lose data?): restored from this replica's cursors and the activity stream",
			"entries", len(restored), "first", restored[0])
	}
	switch {
	case failed:
		s.loadFails++
		s.loadAfter = time.Now().Add(min(time.Duration(s.loadFails)*200*time.Millisecond, 5*time.Second))
	case later:
		s.loadFails = 0
		s.loadAfter = s.hist.countsAt.Add(historyRefresh)
	default:
		s.loadFails = 0
	}
}

// handover closes the entry in each old queue and opens its queue, seeded
// with the newest watermark found. It reports whether a watermark was
// seeded (it must then be read again). Both steps are idempotent, so after
// an error the whole handover is simply repeated.
func (s *Scheduler) handover(ctx context.Context, r *entryRun, from []string) (bool, error) {
	prefix := s.cfg.Names.Prefix()
	var best time.Time
	var bestTask string
	found := false
	for _, q := range from {
		if q == r.queue {
			continue
		}
		tick, task, ok, err := s.cfg.Broker.CloseForHandover(ctx, prefix, q, r.id, r.st.Revision)
		if err != nil {
			s.countError()
			s.log.Warn("close entry in its old queue", "entry", r.id, "queue", q, "err", err)
			s.outcome(Outcome{Entry: r.id, Err: err})
			return false, err
		}
		if ok && (!found || tick.After(best)) {
			best, bestTask, found = tick, task, true
		}
	}
	if err := s.cfg.Broker.SeedWatermark(ctx, prefix, r.queue, r.id, best, bestTask, r.st.Revision); err != nil {
		if !errors.Is(err, taskstate.ErrHandoverSuperseded) {
			s.countError()
			s.log.Warn("seed entry in its new queue", "entry", r.id, "queue", r.queue, "err", err)
			s.outcome(Outcome{Entry: r.id, Err: err})
			return false, err
		}
		// A newer configuration moved the entry on; our fires there will
		// be refused until the projection catches up.
	}
	r.fromQueue = ""
	return found, nil
}

// schedule computes when this replica should next act on r and places it
// in the heap.
func (s *Scheduler) schedule(r *entryRun, now time.Time) {
	next := r.next()
	if next.IsZero() {
		s.heap.remove(r)
		return
	}
	due := next.Add(r.sched.Jitter(next))
	if primaryOf(r.id, s.live) != s.cfg.ReplicaID && len(s.live) > 0 {
		due = due.Add(s.cfg.LateDelay)
	}
	if r.tries > 0 {
		// Back off after refusals and errors, up to 5 s.
		due = maxTime(due, now.Add(min(time.Duration(r.tries)*200*time.Millisecond, 5*time.Second)))
	}
	s.heap.set(r, due)
}

// start is the instant after which r's ticks are still to be handled.
func (r *entryRun) start() time.Time {
	s := r.floor
	if r.hasCursor && r.cursor.After(s) {
		s = r.cursor
	}
	return s
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fireBuf returns an empty slice of fires with room for n, reused from
// earlier passes when one is big enough: a second of 10,000 fires would
// otherwise allocate 4 MB of them. Only the loop goroutine uses the pool.
func (s *Scheduler) fireBuf(n int) []taskstate.Fire {
	for i := len(s.fireBufs) - 1; i >= 0; i-- {
		if b := s.fireBufs[i]; cap(b) >= n {
			s.fireBufs = append(s.fireBufs[:i], s.fireBufs[i+1:]...)
			return b
		}
	}
	return make([]taskstate.Fire, 0, n)
}

// putFireBuf returns a slice to the pool, cleared so it holds no message
// or record alive; the pool keeps what one pass used, up to maxFireBufs.
func (s *Scheduler) putFireBuf(b []taskstate.Fire) {
	if len(s.fireBufs) >= maxFireBufs {
		return
	}
	clear(b)
	s.fireBufs = append(s.fireBufs, b[:0])
}

const maxFireBufs = 64

// fireDue builds the fires of every due entry and sends them per queue in
// batches. Up to Parallel batches are in flight at once while the next ones
// are built, so building (CPU here) and firing (CPU in Redis) overlap; the
// results are applied on the loop goroutine once all are back (applying
// them in between would take CPU from the fires still to go). A batch that
// is back keeps only what apply needs of its fires and hands its buffer to
// the next batch, so a burst of any size holds about Parallel+1 batches of
// fires. A plan's fires (one entry's ticks) always share a batch, so their
// order holds.
func (s *Scheduler) fireDue(ctx context.Context, due []*entryRun) {
	if due = s.confirmHeard(ctx, due); len(due) == 0 {
		return
	}
	if len(due) > s.cfg.Batch {
		s.busy.Store(true)
		defer s.busy.Store(false)
	}
	s.firingSince.Store(int64(max(time.Since(s.epoch), 1)))
	defer s.firingSince.Store(0)
	now := s.clock.Now()
	seq := s.cfg.Projection.LastSeq()
	s.configID = s.cfg.Projection.ConfigMessageID(seq)
	fresh := s.cfg.Projection.LastHeard()
	type planned struct {
		r    *entryRun
		more bool
	}
	type call struct {
		fires   []taskstate.Fire
		owners  []int // plan index of each fire
		sent    []sentFire
		results []taskstate.FireResult
	}
	size := min(s.cfg.Batch, len(due))
	plans := make([]planned, 0, len(due))
	var scratch []taskstate.Fire
	open := map[string]*call{}
	var calls []*call
	// Buffers of batches that are back, for the next batches.
	free := make(chan []taskstate.Fire, s.cfg.Parallel+1)
	var wg sync.WaitGroup
	sem := make(chan struct{}, s.cfg.Parallel)
	send := func(c *call) {
		calls = append(calls, c)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results, err := s.cfg.Broker.FireBatch(ctx, c.fires)
			if err != nil && len(results) != len(c.fires) {
				results = make([]taskstate.FireResult, len(c.fires))
				for i := range results {
					results[i].Err = err
				}
			}
			c.results = results
			c.sent = make([]sentFire, len(c.fires))
			for i := range c.fires {
				c.sent[i] = sentOf(&c.fires[i])
				if m := c.fires[i].Msg; m != nil { // made by buildFire
					*m = taskstate.TaskMessage{}
					fireMessages.Put(m)
				}
			}
			clear(c.fires)
			select {
			case free <- c.fires[:0]:
			default:
			}
			c.fires = nil
			if s.cfg.OnFire != nil {
				s.cfg.OnFire()
			}
		}()
	}
	for _, r := range due {
		fires, more := s.plan(r, now, seq, fresh, scratch[:0])
		scratch = fires
		if len(fires) == 0 {
			s.schedule(r, now)
			continue
		}
		pi := len(plans)
		plans = append(plans, planned{r, more})
		c := open[r.queue]
		if c != nil && len(c.fires)+len(fires) > s.cfg.Batch {
			send(c)
			c = nil
		}
		if c == nil {
			var buf []taskstate.Fire
			select {
			case buf = <-free:
			default:
				buf = s.fireBuf(size)
			}
			c = &call{fires: buf, owners: make([]int, 0, size)}
			open[r.queue] = c
		}
		for range fires {
			c.owners = append(c.owners, pi)
		}
		c.fires = append(c.fires, fires...)
	}
	for _, c := range open {
		send(c)
	}
	wg.Wait()
	close(free)
	for b := range free {
		s.putFireBuf(b)
	}
	history := make([]taskstate.EnqueueEventRecord, 0, len(due))
	for _, c := range calls {
		for i, res := range c.results {
			if h, ok := s.apply(plans[c.owners[i]].r, c.sent[i], res); ok {
				history = append(history, h)
			}
		}
	}
	for _, p := range plans {
		if !p.r.known {
			continue // waiting in s.load for its watermark
		}
		if p.more && p.r.tries == 0 {
			// More missed ticks to fire: come back at once.
			s.heap.set(p.r, now)
			continue
		}
		s.schedule(p.r, s.clock.Now())
	}
	if len(history) > 0 {
		select {
		case s.history <- history:
		default:
			// asynq's own history is best effort too; ours is the stream.
			s.log.Debug("asynq enqueue history writer busy: dropping", "events", len(history))
		}
	}
}

// sentFire is what apply needs to know of a fire once it was sent.
type sentFire struct {
	kind     taskstate.FireKind
	tick     time.Time
	skipped  bool // it carried skipped records of missed ticks
	excluded bool // it carried a skipped record of excluded ticks
}

func sentOf(f *taskstate.Fire) sentFire {
	sf := sentFire{kind: f.Kind, tick: f.Tick}
	sf.skipped, sf.excluded = skipReasons(f.SkippedRecords)
	return sf
}

// writeHistory records asynq's enqueue history beside the loop, so the
// loop does not wait for it.
func (s *Scheduler) writeHistory() {
	for recs := range s.history {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.cfg.Broker.RecordSchedulerEnqueueEvents(ctx, recs); err != nil {
			s.log.Debug("record asynq enqueue history", "events", len(recs), "err", err)
		}
		cancel()
	}
}

// plan turns r's due tick, and any missed ticks before it, into fires,
// appended to into (a scratch slice the caller reuses).
func (s *Scheduler) plan(r *entryRun, now time.Time, seq uint64, fresh time.Time, into []taskstate.Fire) ([]taskstate.Fire, bool) {
	start := r.start()
	next := r.next()
	if next.IsZero() || next.Add(r.sched.Jitter(next)).After(now) {
		return nil, false
	}
	if r.sched.Excluded(next) {
		return s.planExcluded(r, next, now, seq, fresh, into)
	}
	// Only ticks older than grace and the largest jitter are missed; a
	// younger tick is fired normally.
	grace := s.cfg.Grace + r.sched.jitter
	var one [1]time.Time
	var ticks []time.Time
	var skipped tickRange
	more := false
	if next.Before(now.Add(-grace)) {
		p := planCatchup(r.sched, r.st.Entry.Catchup, start, now, grace, s.cfg.MaxCatchup)
		skipped = p.Skipped
		ticks, more = p.Fire, p.More
		if len(ticks) == 0 {
			// Nothing to fire now: record the missed ticks at once, in a
			// step of their own under the same compare-and-set.
			return s.planSkip(r, skipped, now, seq, fresh, into)
		}
	} else {
		one[0] = next
		ticks = one[:]
	}
	fires := into
	expected, expectNone := r.cursor, !r.hasCursor
	for i, tick := range ticks {
		var f taskstate.Fire
		var err error
		if r.sched.Excluded(tick) {
			f, err = s.excludedFire(r, tickRange{First: tick, Last: tick, Count: 1, Exact: true}, now, seq, fresh)
		} else {
			f, err = s.buildFire(r, tick, now, seq, fresh)
		}
		if err != nil {
			s.countError()
			s.log.Error("cannot build fire", "entry", r.id, "tick", tick, "err", err)
			return nil, false
		}
		f.Expected, f.ExpectNone = expected, expectNone
		if i == 0 && !skipped.empty() {
			rec, err := s.skippedRecord(r, skipped, events.SkipMissed, now)
			if err == nil {
				f.SkippedRecords = append(f.SkippedRecords, rec)
			}
		}
		fires = append(fires, f)
		expected, expectNone = tick, false
	}
	return fires, more
}

// planSkip records missed ticks that the catch-up policy drops, moving the
// watermark to the last of them, without creating a task.
func (s *Scheduler) planSkip(r *entryRun, skipped tickRange, now time.Time, seq uint64, fresh time.Time, into []taskstate.Fire) ([]taskstate.Fire, bool) {
	if skipped.empty() {
		return nil, false
	}
	rec, err := s.skippedRecord(r, skipped, events.SkipMissed, now)
	if err != nil {
		s.countError()
		s.log.Error("cannot build skipped record", "entry", r.id, "err", err)
		return nil, false
	}
	return append(into, taskstate.Fire{
		Prefix: s.cfg.Names.Prefix(), Entry: r.id, Queue: r.queue, Kind: taskstate.FireSkip,
		Tick: skipped.Last, Expected: r.cursor, ExpectNone: !r.hasCursor,
		ConfigSeq: seq, ConfigID: s.configID, FreshAsOf: fresh, MaxStaleness: s.cfg.MaxStaleness,
		SkippedRecords: []taskstate.Record{rec},
	}), false
}

// apply acts on one fire's result and returns the asynq history record of
// a created task.
func (s *Scheduler) apply(r *entryRun, f sentFire, res taskstate.FireResult) (taskstate.EnqueueEventRecord, bool) {
	s.outcome(Outcome{Entry: r.id, Tick: f.tick, Status: res.Status, Err: res.Err})
	if res.Err != nil {
		s.countError()
		r.tries++
		s.log.Warn("fire failed; will retry", "entry", r.id, "tick", f.tick, "err", res.Err)
		return taskstate.EnqueueEventRecord{}, false
	}
	status := res.Status
	if status.Refused() {
		s.countRefused(status.String())
		switch status {
		case taskstate.StatusWatermarkMismatch:
			if r.hasHandled && (!res.HasWatermark || res.Watermark.Before(r.handled)) {
				// The watermark vanished under us, or went back before a
				// tick it held (Redis lost data, a lagging replica was
				// promoted): load it again, which re-seeds it from the
				// later of r.handled and the stream, instead of firing
				// those ticks again.
				r.known = false
				r.tries++
				s.heap.remove(r)
				s.load[r.id] = r
				break
			}
			r.cursor, r.hasCursor, r.lastTask = res.Watermark, res.HasWatermark, res.WatermarkTaskID
			r.handled, r.hasHandled = res.Watermark, res.HasWatermark
			r.known = true
			if res.HasWatermark && !res.Watermark.Before(f.tick) {
				r.tries = 0 // someone else handled it: nothing wrong
			} else {
				r.tries++
			}
		case taskstate.StatusMoved:
			r.tries++
			if r.st.Revision > res.MovedAt {
				// Our configuration, newer than the move, says the entry
				// lives here again (it moved away and back while this
				// replica did not follow live): close the queues it used
				// since and reopen this one.
				r.known, r.reopen = false, true
				s.heap.remove(r)
				s.load[r.id] = r
			} else {
				s.suspectEpoch(r.queue, r.id, res.MovedAt, "")
			}
		case taskstate.StatusRevisionFenced:
			r.tries++
			s.suspectEpoch(r.queue, "", res.Fence, res.FenceID)
		default: // stale: our view of the config is behind
			r.tries++
		}
		return taskstate.EnqueueEventRecord{}, false
	}
	r.tries = 0
	if f.kind == taskstate.FireTick || f.kind == taskstate.FireSkip {
		r.cursor, r.hasCursor, r.known = f.tick, true, true
		r.handled, r.hasHandled = f.tick, true
	}
	if f.skipped {
		s.count(func(st *Stats) { st.SkippedMissed++ })
		s.m.Skipped.WithLabelValues(events.SkipMissed).Inc()
	}
	if f.excluded {
		s.count(func(st *Stats) { st.SkippedExcluded++ })
		s.m.Skipped.WithLabelValues(events.SkipExcluded).Inc()
	}
	switch status {
	case taskstate.StatusFired:
		r.lastTask = res.TaskID
		s.count(func(st *Stats) { st.Fired++ })
		s.m.Fired.WithLabelValues(r.queue).Inc()
		s.m.FireLag.Observe(s.clock.Now().Sub(f.tick).Seconds())
		trim := r.recorded%historyTrimEvery == 0
		r.recorded++
		return taskstate.EnqueueEventRecord{Entry: r.id, Event: taskstate.SchedulerEnqueueEvent{TaskID: res.TaskID, EnqueueTime: s.clock.Now()}, Trim: trim}, true
	case taskstate.StatusAlreadyExists:
		s.count(func(st *Stats) { st.AlreadyExisted++ })
	case taskstate.StatusSkippedOverlap:
		s.count(func(st *Stats) { st.SkippedOverlap++ })
		s.m.Skipped.WithLabelValues(events.SkipOverlap).Inc()
	case taskstate.StatusDuplicate:
		s.count(func(st *Stats) { st.SkippedUnique++ })
		s.m.Skipped.WithLabelValues(events.SkipUnique).Inc()
	}
	return taskstate.EnqueueEventRecord{}, false
}

// buildFire makes the fire of one tick of r.
func (s *Scheduler) buildFire(r *entryRun, tick, now time.Time, seq uint64, fresh time.Time) (taskstate.Fire, error) {
	prefix := s.cfg.Names.Prefix()
	e := r.st.Entry
	taskID := prefix + ":" + r.id + ":" + s.tickText(tick) // TaskID
	msg := fireMessages.Get().(*taskstate.TaskMessage)
	fillTaskMessage(msg, e, taskID, tick)
	fired := s.firedRecord(r, tick, taskID, now)
	f := taskstate.Fire{
		Prefix: prefix, Entry: r.id, Queue: r.queue, Kind: taskstate.FireTick,
		Tick: tick, ConfigSeq: seq, ConfigID: s.configID, FreshAsOf: fresh, MaxStaleness: s.cfg.MaxStaleness,
		Msg: msg, UniqueTTL: e.Options.Unique.D(), FiredRecord: fired,
	}
	var err error
	if e.Overlap == events.OverlapSkip {
		f.OverlapSkip = true
		if f.OverlapRecord, err = s.skippedRecord(r, tickRange{First: tick, Last: tick, Count: 1, Exact: true}, events.SkipOverlap, now); err != nil {
			return taskstate.Fire{}, err
		}
	}
	if f.UniqueTTL > 0 {
		if f.DuplicateRecord, err = s.skippedRecord(r, tickRange{First: tick, Last: tick, Count: 1, Exact: true}, events.SkipUnique, now); err != nil {
			return taskstate.Fire{}, err
		}
	}
	return f, nil
}

// tickText is tick as TaskID writes it, remembered for the last tick: the
// fires of one instant share it (TaskID per fire, mostly this formatting,
// was 7% of a 100,000-fire burst's CPU profile).
func (s *Scheduler) tickText(tick time.Time) string {
	if !tick.Equal(s.lastTick) || s.lastTickText == "" {
		s.lastTick, s.lastTickText = tick, tick.UTC().Format(time.RFC3339)
	}
	return s.lastTickText
}

// TaskMessage is the asynq task of entry e's tick, with asynq's client
// defaults; the deadline is relative to the tick.
func TaskMessage(e events.Entry, taskID string, tick time.Time) *taskstate.TaskMessage {
	return taskMessage(e.Normalize(), taskID, tick)
}

// taskMessage is TaskMessage of an entry already normalized (as the
// projection holds them), without copying its payload for every fire.
func taskMessage(e events.Entry, taskID string, tick time.Time) *taskstate.TaskMessage {
	m := new(taskstate.TaskMessage)
	fillTaskMessage(m, e, taskID, tick)
	return m
}

// fillTaskMessage writes entry e's task of tick into m.
func fillTaskMessage(m *taskstate.TaskMessage, e events.Entry, taskID string, tick time.Time) {
	*m = taskstate.TaskMessage{
		Type:      e.Task.Type,
		Payload:   e.Task.Payload,
		Headers:   e.Task.Headers,
		ID:        taskID,
		Queue:     e.Options.QueueName(),
		Retry:     int32(e.Options.Retries()),
		Timeout:   int64(e.Options.Timeout.D() / time.Second),
		Retention: int64(e.Options.Retention.D() / time.Second),
		GroupKey:  e.Options.Group,
	}
	if d := e.Options.Deadline.D(); d > 0 {
		m.Deadline = tick.Add(d).Unix()
	}
}

// fireMessages recycles the task messages of scheduled fires: a message is
// only read while its fire is sent (taskstate encodes it), and a burst
// would otherwise allocate one per fire.
var fireMessages = sync.Pool{New: func() any { return new(taskstate.TaskMessage) }}

// Event ids are derived from what they describe, so the same fact always
// has the same id (and the stream drops a republished one), and observers
// can read entry and tick off the Nats-Msg-Id header without decoding.
func firedEventID(entry string, tick time.Time) string {
	return "fire:" + entry + ":" + strconv.FormatInt(tick.Unix(), 10)
}

func skippedEventID(entry string, r tickRange) string {
	if r.Count <= 1 {
		return "skip:" + entry + ":" + strconv.FormatInt(r.Last.Unix(), 10)
	}
	return "skip:" + entry + ":" + strconv.FormatInt(r.First.Unix(), 10) + "-" + strconv.FormatInt(r.Last.Unix(), 10)
}

// ParseActivityID reads entry and last tick from a fired or skipped event
// id; ok is false for other ids (triggers, recoveries).
func ParseActivityID(id string) (entry string, tick time.Time, ok bool) {
	kind, rest, found := strings.Cut(id, ":")
	if !found || (kind != "fire" && kind != "skip") {
		return "", time.Time{}, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", time.Time{}, false
	}
	entry, ts := rest[:i], rest[i+1:]
	if strings.IndexByte(entry, ':') >= 0 {
		return "", time.Time{}, false // not an entry id: a trigger's record
	}
	if _, last, isRange := strings.Cut(ts, "-"); isRange {
		ts = last
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", time.Time{}, false
	}
	return entry, time.Unix(sec, 0).UTC(), true
}

func (s *Scheduler) source() string { return s.src }

// firedRecord is the outbox record of a scheduled tick's fired event, in
// the compact form the relay expands (events.AppendFiredRecord); its times
// come out in UTC, as in every activity event.
func (s *Scheduler) firedRecord(r *entryRun, tick time.Time, taskID string, now time.Time) taskstate.Record {
	f := events.Fired{
		Entry: r.id, ScheduledAt: tick, EnqueuedAt: now, TaskID: taskID, Queue: r.queue,
		Revision: r.st.Revision, Replica: s.cfg.ReplicaID,
	}
	var tmp [256]byte
	return taskstate.Record{ID: firedEventID(r.id, tick), Data: bytes.Clone(events.AppendFiredRecord(tmp[:0], &f))}
}

func (s *Scheduler) skippedRecord(r *entryRun, rng tickRange, reason string, now time.Time) (taskstate.Record, error) {
	id := skippedEventID(r.id, rng)
	data := events.Skipped{Entry: r.id, ScheduledAt: rng.First.UTC(), Reason: reason, Revision: r.st.Revision, Replica: s.cfg.ReplicaID}
	if rng.Count > 1 {
		last := rng.Last.UTC()
		data.Until, data.Count = &last, rng.Count
	}
	ev, err := events.NewEventAt(id, now, events.TypeEntrySkipped, s.source(), r.id, data)
	if err != nil {
		return taskstate.Record{}, err
	}
	b, err := ev.Marshal()
	return taskstate.Record{ID: id, Data: b}, err
}

// visibilityGap is how far the next due fire must be for asynq's entries
// to be rewritten: with 100,000 entries the rewrite is a 13 MB write
// (measured: 112 ms of Redis CPU, 246 ms from encoding to reply), which must
// not land on a burst of fires.
const visibilityGap = time.Second

// maybeWriteVisibility starts the pending rewrite of asynq's scheduler
// entries when nothing is due within visibilityGap; when entries are due
// all the time (every second), right after a pass of fires once it waited
// half a period; and after a whole period in any case (the entries expire
// after two).
func (s *Scheduler) maybeWriteVisibility(afterFire bool) {
	if !s.visPending {
		return
	}
	waited := time.Since(s.visSince)
	quiet := true
	if at, ok := s.heap.peek(); ok && at.Sub(s.clock.Now()) < visibilityGap {
		quiet = false
	}
	if !quiet && !(afterFire && waited >= s.cfg.Visibility/2) && waited < s.cfg.Visibility {
		return
	}
	if len(s.vis) > 0 {
		return // the last snapshot is not even taken up yet: stay pending
	}
	if entries, ok := s.visibilitySnapshot(); ok {
		s.vis <- entries // the loop is the only sender: there is room
	}
	s.visPending = false
}

// writeVisibilityLoop writes the snapshots the loop hands over, beside it.
func (s *Scheduler) writeVisibilityLoop() {
	for entries := range s.vis {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := s.cfg.Broker.WriteSchedulerEntries(ctx, taskstate.SchedulerID(s.cfg.Names.Prefix()), entries, 2*s.cfg.Visibility); err != nil {
			s.log.Debug("write asynq scheduler entries", "err", err)
		}
		cancel()
	}
}

// visibilitySnapshot lists asynq's scheduler entries for ours, so
// `asynq cron ls` lists them. One replica writes (the primary of a fixed
// key), so the cost does not grow with the number of replicas; ok is false
// on the others. asynq's SchedulerEntry has no paused field: a paused entry
// is listed with its spec marked (taskstate.PausedSpec) and no next enqueue
// time (docs/asynq-compat.md).
func (s *Scheduler) visibilitySnapshot() ([]taskstate.SchedulerEntry, bool) {
	if primaryOf("~asynq-visibility", s.liveReplicas()) != s.cfg.ReplicaID {
		return nil, false
	}
	out := make([]taskstate.SchedulerEntry, 0, len(s.entries)+len(s.pausedEntries))
	for _, r := range s.entries {
		if r.st.Entry.Paused || r.sched == nil {
			continue
		}
		var prev time.Time
		if r.hasCursor {
			prev = r.cursor
		}
		out = append(out, schedulerEntry(r.id, r.st, r.next(), prev))
	}
	for id, st := range s.pausedEntries {
		var prev time.Time
		if r := s.entries[id]; r != nil && r.hasCursor {
			prev = r.cursor
		}
		out = append(out, schedulerEntry(id, st, time.Time{}, prev))
	}
	return out, true
}

// schedulerEntry is asynq's view of entry id in state st.
func schedulerEntry(id string, st projector.State, next, prev time.Time) taskstate.SchedulerEntry {
	e := st.Entry
	opts := taskstate.EnqueueOptions{
		Queue: e.Options.QueueName(), MaxRetry: e.Options.Retries(), Timeout: e.Options.Timeout.D(),
		Unique: e.Options.Unique.D(), Retention: e.Options.Retention.D(), Group: e.Options.Group,
	}
	spec := e.Cron
	if e.Paused {
		spec = taskstate.PausedSpec(spec)
	}
	return taskstate.SchedulerEntry{
		ID: id, Spec: spec, TaskType: e.Task.Type, TaskPayload: e.Task.Payload,
		EnqueueOptions: opts.Strings(), Next: next, Prev: prev,
	}
}

func (s *Scheduler) outcome(o Outcome) {
	if s.cfg.OnOutcome != nil {
		s.cfg.OnOutcome(o)
	}
}

func (s *Scheduler) setEntriesGauge() {
	n := len(s.entries)
	s.mu.Lock()
	s.stats.Entries, s.stats.Loading = n, len(s.load)
	s.mu.Unlock()
	s.m.Entries.Set(float64(n))
}

func (s *Scheduler) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *Scheduler) countError() {
	s.count(func(st *Stats) { st.Errors++ })
	s.m.Errors.Inc()
}

func (s *Scheduler) countRefused(status string) {
	s.count(func(st *Stats) { st.Refused[status]++ })
	s.m.Refused.WithLabelValues(status).Inc()
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
