// Package recoverer finds asynq tasks whose worker died — their lease
// expired — and retries or archives them with asynq's rules, every outcome
// an event (docs/invariants.md INV-outbox and INV-lease-recheck).
//
// It owns the recovery loop and the decisions (archive when retried ≥ max
// retry, else retry after the retry delay), the per-queue error counting and
// the recovery metrics. It never writes Redis itself: every move is one
// taskstate script that re-checks the lease and the message inside Redis and
// appends the outcome record to the queue's outbox in the same step, for the
// relay to publish.
//
// asynq servers run their own recoverer every minute with a 30 s cutoff and
// it cannot be switched off; a task it recovers first has no event of ours.
// The defaults (interval 5 s, grace 20 s) act well before it: recovery 20–25 s
// after the lease expired, where asynq's takes 30–90 s.
//
// With shard ownership each queue is recovered by the replica that holds
// its duties (Config.Holds: the owner of the queue's shard 0); a replica
// that takes a queue over recovers it at once (Config.Changed), so a dead
// owner's queues are recovered within the takeover bound, well before
// asynq's recoverer: grace + interval + takeover < 20 + 5 + 5 s.
package recoverer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// store is the recoverer's seam to Redis; *taskstate.Store implements it,
// and tests wrap it to inject faults (export_test.go).
type store interface {
	Queues(ctx context.Context) ([]string, error)
	ListTailFirst(ctx context.Context, queue string, cutoff time.Time, offset, limit int) ([]taskstate.LeaseRef, error)
	LoadLeaseExpired(ctx context.Context, queue string, refs []taskstate.LeaseRef) ([]taskstate.LeaseExpired, []taskstate.BadTask, error)
	RecoverBatch(ctx context.Context, prefix, queue string, cutoff time.Time, decisions []taskstate.Decision) ([]taskstate.Outcome, error)
	RecoverOrphans(ctx context.Context, queue string, now time.Time, leaseDuration time.Duration, limit int) (taskstate.OrphanReport, error)
	ReclaimStaleAggregationSets(ctx context.Context, prefix, queue string, now time.Time, record taskstate.ReclaimRecordFunc) ([]taskstate.Reclaimed, error)
	RegisterOutbox(ctx context.Context, prefix, queue string) error
}

// RetryDelayFunc returns how long to wait before the next attempt of a task
// that failed for the retried-th time (retried counts the failures before
// this one), like asynq's Config.RetryDelayFunc.
type RetryDelayFunc func(retried int, err error, task *Task) time.Duration

// Task is what a RetryDelayFunc learns of the task it delays: the fields of
// asynq's task message that its own RetryDelayFunc can read.
type Task struct {
	ID, Type, Queue string
	Payload         []byte
	// Retried counts the failures before this one; MaxRetry is the task's
	// retry limit.
	Retried, MaxRetry int
}

// IsFailureFunc says whether err counts as a failure (retried+1 and the
// failed counters), like asynq's Config.IsFailure.
type IsFailureFunc func(err error) bool

// ErrLeaseExpired is the error a recovered task failed with; its text is
// asynq's.
var ErrLeaseExpired = errors.New("asynq: task lease expired")

// DefaultRetryDelay is asynq's DefaultRetryDelayFunc: n⁴ + 15 + r·(n+1)
// seconds with r uniform in [0, 30).
func DefaultRetryDelay(n int, _ error, _ *Task) time.Duration {
	r := rand.IntN(30)
	s := int64(math.Pow(float64(n), 4)) + 15 + int64(r*(n+1))
	return time.Duration(s) * time.Second
}

// DefaultIsFailure is asynq's default: every error is a failure.
func DefaultIsFailure(err error) bool { return err != nil }

// Defaults.
const (
	DefaultInterval = 5 * time.Second
	DefaultGrace    = 20 * time.Second
	DefaultBatch    = 10_000
)

// Config configures a Recoverer. Zero values mean the defaults.
type Config struct {
	// Redis holds the asynq queues to recover.
	Redis     redis.UniversalClient
	Names     events.Names
	ReplicaID string
	// Queues to recover; empty means every queue in asynq:queues, read
	// again each pass so new queues are picked up without a restart.
	Queues []string
	// Holds says whether this replica recovers queue (it holds the
	// queue's duties, ownership.Manager.HoldsQueue); nil: every queue.
	// Changed, when set, is signalled when what Holds says may have
	// changed: the queues it newly holds are recovered at once.
	Holds   func(queue string) bool
	Changed <-chan struct{}
	// Interval between passes (default 5 s). The first pass runs at Start.
	Interval time.Duration
	// Grace: a task is recovered once its lease has been expired this long
	// (default 20 s), so workers' clock skew cannot make us steal a task.
	Grace time.Duration
	// Batch is how many tasks one move handles (default 10,000;
	// taskstate splits it into short script calls); a pass lists the ids
	// of ten batches at a time and cuts its batches in active-list order,
	// so each move touches one stretch of the list's tail.
	Batch      int
	RetryDelay RetryDelayFunc
	IsFailure  IsFailureFunc
	// OnRecord is called after records were written (the relay's Notify).
	OnRecord func()
	Logger   *slog.Logger
	Metrics  *Metrics
	// Now is the clock lease expiries are compared with (default
	// time.Now). A replica passes its clock corrected to Redis TIME
	// (clock): lease scores come from workers' clocks, which are
	// right when they agree with Redis, and a replica whose own clock runs
	// fast must not recover live tasks.
	Now func() time.Time

	store store // Redis, or a test's wrapper around it
}

// Recoverer is one replica's recovery loop.
type Recoverer struct {
	cfg Config
	log *slog.Logger
	m   *Metrics

	mu         sync.Mutex
	stats      map[string]*QueueStats
	reported   map[string]bool // queue + "\x00" + id of bad tasks already logged
	registered map[string]bool // queues whose outbox is registered
	// held are the queues the last pass recovered (Holds), loop-owned.
	held   map[string]bool
	passes chan PassResult // test hook, nil unless Passes() was called

	life lifecycle.Lifecycle
}

// QueueStats are one queue's recovery counters.
type QueueStats struct {
	Retried, Archived, Skipped, Bad, OrphansLeased, OrphansRemoved, Reclaimed, Errors uint64
	LastPass                                                                          time.Time
}

// PassResult describes one pass, for tests that wait for a pass.
type PassResult struct {
	Started time.Time
	Moved   int
	Err     error
}

// New validates cfg and returns a recoverer; Start runs it.
func New(cfg Config) (*Recoverer, error) {
	if cfg.Redis == nil && cfg.store == nil {
		return nil, errors.New("recoverer: Config.Redis is required")
	}
	if cfg.store == nil {
		cfg.store = taskstate.New(cfg.Redis)
	}
	// A negative value is taken as unset too, as it always was.
	cfg.Interval = cmp.Or(max(cfg.Interval, 0), DefaultInterval)
	cfg.Grace = cmp.Or(max(cfg.Grace, 0), DefaultGrace)
	cfg.Batch = cmp.Or(max(cfg.Batch, 0), DefaultBatch)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	// Functions are not comparable, so cmp.Or cannot default them.
	if cfg.RetryDelay == nil {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.IsFailure == nil {
		cfg.IsFailure = DefaultIsFailure
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	// The queue list is ours: Pass sorts it, and the caller's slice must
	// neither change under it nor be changed by it.
	cfg.Queues = slices.Clone(cfg.Queues)
	slices.Sort(cfg.Queues)
	return &Recoverer{cfg: cfg, log: cfg.Logger, m: m,
		stats: map[string]*QueueStats{}, reported: map[string]bool{}, registered: map[string]bool{}, held: map[string]bool{}}, nil
}

// Passes returns a channel that receives the result of every pass from now
// on (buffered; results are dropped when nobody reads). For tests.
func (r *Recoverer) Passes() <-chan PassResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.passes == nil {
		r.passes = make(chan PassResult, 64)
	}
	return r.passes
}

// Start runs a pass now and then every interval until Stop, and returns
// at once. Start and Stop follow the rules of package lifecycle (a second
// Start returns ErrAlreadyStarted, a Start after Stop ErrStopped).
func (r *Recoverer) Start(ctx context.Context) error {
	if err := r.life.StartLoop(ctx, r.loop); err != nil {
		return fmt.Errorf("recoverer: %w", err)
	}
	return nil
}

// Stop lets the pass in flight finish its current batch, no longer than
// ctx allows (then the batch is cancelled and ctx's error returned), and
// stops. A Pass called after Stop, started or not, recovers nothing more.
func (r *Recoverer) Stop(ctx context.Context) error {
	if _, err := r.life.Drain(ctx); err != nil {
		return fmt.Errorf("recoverer: stop: batch cancelled: %w", err)
	}
	return nil
}

func (r *Recoverer) loop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	stop := r.life.Stopping()
	for {
		var res PassResult
		select {
		case <-stop:
			return
		case <-t.C:
			res = r.Pass(ctx)
			t.Reset(r.cfg.Interval)
		case <-r.cfg.Changed:
			// Queues taken over are recovered now; the others keep
			// their interval.
			held := r.heldSet()
			res = r.pass(ctx, func(q string) bool { return !held[q] })
		}
		r.mu.Lock()
		if r.passes != nil {
			select {
			case r.passes <- res:
			default:
			}
		}
		r.mu.Unlock()
	}
}

// heldSet returns the queues the last pass recovered.
func (r *Recoverer) heldSet() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.held)
}

func (r *Recoverer) stopping() bool {
	select {
	case <-r.life.Stopping():
		return true
	default:
		return false
	}
}

// Pass recovers every queue this replica holds once. Errors of one queue
// are counted and logged with its name and never stop the other queues.
func (r *Recoverer) Pass(ctx context.Context) PassResult { return r.pass(ctx, nil) }

// pass is Pass over the queues held that only accepts (nil: all).
func (r *Recoverer) pass(ctx context.Context, only func(string) bool) PassResult {
	start := r.cfg.Now()
	res := PassResult{Started: start}
	queues := r.cfg.Queues // sorted by New
	if len(queues) == 0 {
		qs, err := r.cfg.store.Queues(ctx)
		if err != nil {
			r.m.Errors.WithLabelValues("").Inc()
			r.log.Warn("recoverer: list queues", "err", err)
			res.Err = err
			return res
		}
		queues = slices.Sorted(slices.Values(qs))
	}
	queues = r.holding(queues)
	var errs []error
	for _, q := range queues {
		if r.stopping() {
			break
		}
		if only != nil && !only(q) {
			continue
		}
		// The queue's series exist before its pass is seen to end: a
		// scrape that finds the pass finds them too.
		r.m.initQueue(q)
		// Durations use the monotonic clock: Config.Now may be a test's
		// fake clock.
		began := time.Now()
		n, err := r.recoverQueue(ctx, q)
		r.m.PassDuration.WithLabelValues(q).Observe(time.Since(began).Seconds())
		res.Moved += n
		if err != nil {
			r.queueStats(q, func(s *QueueStats) { s.Errors++ })
			r.m.Errors.WithLabelValues(q).Inc()
			r.log.Warn("recoverer: queue failed this pass", "queue", q, "err", err)
			errs = append(errs, fmt.Errorf("queue %q: %w", q, err))
		}
		r.queueStats(q, func(s *QueueStats) { s.LastPass = start })
	}
	res.Err = errors.Join(errs...)
	return res
}

// holding returns the queues of queues this replica recovers (Holds),
// notes them (the queues a takeover adds are those not noted), and logs
// and exports the change.
func (r *Recoverer) holding(queues []string) []string {
	if r.cfg.Holds == nil {
		r.m.Queues.Set(float64(len(queues)))
		return queues
	}
	out := make([]string, 0, len(queues))
	held := make(map[string]bool, len(queues))
	for _, q := range queues {
		if r.cfg.Holds(q) {
			out = append(out, q)
			held[q] = true
		}
	}
	r.mu.Lock()
	prev := r.held
	r.held = held
	r.mu.Unlock()
	r.m.Queues.Set(float64(len(held)))
	var gained []string
	for _, q := range out {
		if !prev[q] {
			gained = append(gained, q)
		}
	}
	if len(gained) > 0 {
		r.log.Info("recoverer: recovering queues newly held (this replica holds their duties)", "queues", strings.Join(gained, ","), "holding", len(held))
	}
	return out
}

// recoverQueue runs the three repairs of one queue: expired leases,
// orphans, stale aggregation sets.
func (r *Recoverer) recoverQueue(ctx context.Context, q string) (int, error) {
	prefix := r.cfg.Names.Prefix()
	if !r.isRegistered(q) {
		if err := r.cfg.store.RegisterOutbox(ctx, prefix, q); err != nil {
			return 0, fmt.Errorf("register outbox: %w", err)
		}
		r.mu.Lock()
		r.registered[q] = true
		r.mu.Unlock()
	}
	var errs []error
	// Expired leases first, orphans second: after a mass crash the active
	// list is mostly dead tasks, and the orphan walk (every list element)
	// is then over the survivors only. The order changes nothing else: an
	// orphan's new lease ends in the future, so it is never recovered in
	// the pass that gave it.
	moved, err := r.recoverLeases(ctx, q)
	if err != nil {
		errs = append(errs, err)
	}
	// 0: taskstate's lease duration (asynq's 30 s) and page size, which
	// keeps each script call short whatever Batch is.
	rep, err := r.cfg.store.RecoverOrphans(ctx, q, r.cfg.Now(), 0, 0)
	if err != nil {
		errs = append(errs, fmt.Errorf("orphans: %w", err))
	} else if len(rep.Leased)+len(rep.Removed) > 0 {
		r.queueStats(q, func(s *QueueStats) {
			s.OrphansLeased += uint64(len(rep.Leased))
			s.OrphansRemoved += uint64(len(rep.Removed))
		})
		r.m.Orphans.WithLabelValues(q, "leased").Add(float64(len(rep.Leased)))
		r.m.Orphans.WithLabelValues(q, "removed").Add(float64(len(rep.Removed)))
		r.log.Info("recoverer: repaired orphaned active tasks", "queue", q, "leased", len(rep.Leased), "removed", len(rep.Removed))
	}
	reclaimed, err := r.cfg.store.ReclaimStaleAggregationSets(ctx, prefix, q, r.cfg.Now(), r.reclaimRecord)
	if err != nil {
		errs = append(errs, fmt.Errorf("reclaim aggregation sets: %w", err))
	}
	if len(reclaimed) > 0 {
		r.queueStats(q, func(s *QueueStats) { s.Reclaimed += uint64(len(reclaimed)) })
		r.m.Reclaimed.WithLabelValues(q).Add(float64(len(reclaimed)))
		r.notify()
	}
	return moved, errors.Join(errs...)
}

// page is one batch of lease-expired tasks and the decisions made on it.
type page struct {
	decisions []taskstate.Decision
	// stays is how many of its tasks are known to stay in the lease range
	// (bad, or no decision could be made).
	stays int
}

// recoverLeases lists the ids of lease-expired tasks, up to
// listingBatches batches at a time, ordered by where they sit in the
// active list (ListTailFirst), and moves them in batches cut in that
// order. After a mass crash the expired tasks are spread over the whole
// list; a batch cut in lease order would be spread over it too, and its
// moves could not take their tasks off the list's tail in one stretch.
//
// Tasks left where they are (bad, or skipped because their message changed
// or their state is not active) stay in the lease range, so the next
// round's listing steps past them.
func (r *Recoverer) recoverLeases(ctx context.Context, q string) (int, error) {
	cutoff := r.cfg.Now().Add(-r.cfg.Grace)
	round := listingBatches * r.cfg.Batch
	offset, moved := 0, 0
	for !r.stopping() {
		refs, err := r.cfg.store.ListTailFirst(ctx, q, cutoff, offset, round)
		if err != nil {
			return moved, fmt.Errorf("list expired leases: %w", err)
		}
		if len(refs) == 0 {
			break
		}
		n, stays, err := r.recoverRefs(ctx, q, cutoff, refs)
		moved += n
		if err != nil || len(refs) < round {
			return moved, err
		}
		offset += stays
	}
	return moved, nil
}

// listingBatches bounds the ids one listing of recoverLeases holds, in
// batches: the ids are small, and a larger listing orders more of a mass
// crash at once.
const listingBatches = 10

// recoverRefs moves refs in batches and returns how many it moved and how
// many stay in the lease range.
//
// The next batch is loaded and decided while the current one moves:
// deciding (re-encoding each message, building its event) is Go work that
// would otherwise wait for Redis, and Redis for it. Only the first batch is
// decided with nothing to overlap, so batches start small (firstPage) and
// double up to Batch: a few small moves in front of a mass crash cost
// little, and deciding a whole Batch first would cost more.
func (r *Recoverer) recoverRefs(ctx context.Context, q string, cutoff time.Time, refs []taskstate.LeaseRef) (moved, stays int, err error) {
	prefix := r.cfg.Names.Prefix()
	size := min(firstPage, r.cfg.Batch, len(refs))
	cur, err := r.loadPage(ctx, q, refs[:size])
	if err != nil {
		return 0, 0, err
	}
	refs = refs[size:]
	for {
		more := len(refs) > 0 && !r.stopping()
		var (
			outcomes []taskstate.Outcome
			moveErr  error
			movedCh  = make(chan struct{})
		)
		go func() {
			defer close(movedCh)
			outcomes, moveErr = r.cfg.store.RecoverBatch(ctx, prefix, q, cutoff, cur.decisions)
		}()
		var (
			next    page
			nextErr error
		)
		if more {
			size = min(2*size, r.cfg.Batch, len(refs))
			next, nextErr = r.loadPage(ctx, q, refs[:size])
			refs = refs[size:]
		}
		<-movedCh
		n := r.count(q, outcomes)
		moved += n
		if n > 0 {
			r.notify()
		}
		stays += cur.stays
		// Whatever was not moved and not gone is still listed.
		for _, o := range outcomes {
			if o.Status == taskstate.RecoverSkippedMessageChanged || o.Status == taskstate.RecoverSkippedNotActive {
				stays++
			}
		}
		switch {
		case moveErr != nil:
			return moved, stays, fmt.Errorf("recover batch: %w", moveErr)
		case nextErr != nil:
			return moved, stays, nextErr
		case !more || r.stopping():
			// Stopping: the next batch was only decided, nothing written.
			return moved, stays, nil
		}
		cur = next
	}
}

// firstPage is the size of a pass's first batch of lease-expired tasks.
const firstPage = 500

// loadPage reads the messages of refs, reports the bad ones and makes the
// decisions on the others.
func (r *Recoverer) loadPage(ctx context.Context, q string, refs []taskstate.LeaseRef) (page, error) {
	tasks, bad, err := r.cfg.store.LoadLeaseExpired(ctx, q, refs)
	if err != nil {
		return page{}, fmt.Errorf("read expired leases: %w", err)
	}
	r.reportBad(q, bad)
	p := page{stays: len(bad)}
	now := r.cfg.Now()
	p.decisions = make([]taskstate.Decision, 0, len(tasks))
	for _, le := range tasks {
		d, err := r.decide(le, now)
		if err != nil {
			r.reportBad(q, []taskstate.BadTask{{ID: le.Msg.ID, Err: err}})
			p.stays++
			continue
		}
		p.decisions = append(p.decisions, d)
	}
	return p, nil
}

// decide applies asynq's rule to one task: archive when its retries are
// used up, else retry after the retry delay.
func (r *Recoverer) decide(le taskstate.LeaseExpired, now time.Time) (taskstate.Decision, error) {
	msg := le.Msg
	data := events.TaskRecovered{
		TaskID: msg.ID, Queue: msg.Queue, Type: msg.Type,
		MaxRetry: int(msg.Retry), Error: ErrLeaseExpired.Error(), Replica: r.cfg.ReplicaID,
	}
	var d taskstate.Decision
	var err error
	typ := events.TypeTaskArchived
	if msg.Retried >= msg.Retry {
		data.Retried = int(msg.Retried)
		d, err = le.Archive(ErrLeaseExpired.Error(), now)
	} else {
		isFailure := r.cfg.IsFailure(ErrLeaseExpired)
		task := Task{ID: msg.ID, Type: msg.Type, Queue: msg.Queue, Payload: msg.Payload, Retried: int(msg.Retried), MaxRetry: int(msg.Retry)}
		at := now.Add(r.cfg.RetryDelay(int(msg.Retried), ErrLeaseExpired, &task)).Truncate(time.Second)
		data.Retried = int(msg.Retried)
		if isFailure {
			data.Retried++
		}
		data.RetryAt = &at
		typ = events.TypeTaskRetried
		d, err = le.Retry(at, ErrLeaseExpired.Error(), isFailure, now)
	}
	if err != nil {
		return taskstate.Decision{}, err
	}
	// The id names the attempt that was lost, so the same loss always has
	// the same event id however many recoverers decide it.
	id := events.RecoveredEventID(msg.Queue, msg.ID, int(msg.Retried), le.LeaseExpiry)
	d.Record = taskstate.Record{ID: id, Data: outbox.AppendTaskRecoveredEvent(make([]byte, 0, 512), id, now, typ, events.ReplicaSource(r.cfg.ReplicaID), msg.Queue, &data)}
	return d, nil
}

// reclaimRecord builds the outbox record of one reclaimed aggregation set.
func (r *Recoverer) reclaimRecord(set taskstate.StaleAggregationSet) (taskstate.Record, error) {
	id := events.ReclaimedEventID(set.Queue, set.SetID)
	ev, err := events.NewEventAt(id, r.cfg.Now(), events.TypeAggregationReclaimed, events.ReplicaSource(r.cfg.ReplicaID), set.Queue, events.AggregationReclaimed{
		Queue: set.Queue, Group: set.Group, Set: set.SetID, Tasks: len(set.TaskIDs), Replica: r.cfg.ReplicaID,
	})
	if err != nil {
		return taskstate.Record{}, err
	}
	b, err := ev.Marshal()
	return taskstate.Record{ID: id, Data: b}, err
}

func (r *Recoverer) count(q string, outcomes []taskstate.Outcome) int {
	var retried, archived, skipped, searched int
	for _, o := range outcomes {
		if o.Searched {
			searched++
		}
		switch o.Status {
		case taskstate.RecoverRetried:
			retried++
		case taskstate.RecoverArchived:
			archived++
		case taskstate.RecoverNotAttempted:
		default:
			skipped++
		}
	}
	r.queueStats(q, func(s *QueueStats) {
		s.Retried += uint64(retried)
		s.Archived += uint64(archived)
		s.Skipped += uint64(skipped)
	})
	r.m.Recovered.WithLabelValues(q, "retried").Add(float64(retried))
	r.m.Recovered.WithLabelValues(q, "archived").Add(float64(archived))
	r.m.Recovered.WithLabelValues(q, "skipped").Add(float64(skipped))
	r.m.Searched.WithLabelValues(q).Add(float64(searched))
	return retried + archived
}

// reportBad logs each bad task once (per process) and counts it.
func (r *Recoverer) reportBad(q string, bad []taskstate.BadTask) {
	for _, b := range bad {
		key := q + "\x00" + b.ID
		r.mu.Lock()
		seen := r.reported[key]
		r.reported[key] = true
		r.mu.Unlock()
		if seen {
			continue
		}
		r.queueStats(q, func(s *QueueStats) { s.Bad++ })
		r.m.Bad.WithLabelValues(q).Inc()
		r.log.Error("recoverer: lease-expired task cannot be recovered; left as it is", "queue", q, "task", b.ID, "err", b.Err)
	}
}

func (r *Recoverer) notify() {
	if r.cfg.OnRecord != nil {
		r.cfg.OnRecord()
	}
}

func (r *Recoverer) isRegistered(q string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered[q]
}

func (r *Recoverer) queueStats(q string, f func(*QueueStats)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats[q]
	if s == nil {
		s = &QueueStats{}
		r.stats[q] = s
	}
	f(s)
}

// Stats returns a copy of the per-queue counters.
func (r *Recoverer) Stats() map[string]QueueStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]QueueStats, len(r.stats))
	for q, s := range r.stats {
		out[q] = *s
	}
	return out
}
