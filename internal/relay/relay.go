// Package relay moves outbox records from Redis to the activity stream.
//
// Scheduler and recoverer write each outcome into a per-queue outbox in
// Redis, in the same atomic step as the task change it describes. The relay
// publishes those records to <P>_ACTIVITY in order, with Nats-Msg-Id set to
// the event id, and deletes a record only after JetStream acknowledged it.
// A crash between publish and delete republishes the record and the stream's
// duplicate window drops it; for records older than half that window the
// relay first reads the event ids stored on the subject since the record was
// written, and publishes only what is not there. Each outbox has one owner
// at a time (a lease in the outbox's slot), so records of one queue are
// published in order; a dead owner's outbox is taken over once its lease
// lapses.
//
// With shard ownership a relay takes the outboxes of the queues whose
// duties its replica holds (Config.Owns: the owner of the queue's shard
// 0) and lets go of the others, so each outbox is relayed by one replica
// and a killed owner's outboxes move with its shards. An outbox nobody
// relays (its lease free, its oldest record waiting longer than
// OrphanAfter: its owner was killed and the shard is not taken yet, or
// its owner cannot reach NATS and yielded it) is published by any relay
// for one pass at a time.
//
// The relay never changes task state and never drops a record: when NATS is
// down records wait in Redis, and the backlog it reports (records and bytes)
// lets the scheduler pause firing before Redis fills.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Outbox is the relay's seam to Redis; *taskstate.Store implements it.
type Outbox interface {
	OutboxQueues(ctx context.Context, prefix string) ([]string, error)
	AcquireOutbox(ctx context.Context, prefix, queue, owner string, ttl time.Duration) (bool, error)
	RenewOutbox(ctx context.Context, prefix, queue, owner string, ttl time.Duration) (bool, error)
	ReleaseOutbox(ctx context.Context, prefix, queue, owner string) error
	ReadOutbox(ctx context.Context, prefix, queue, after string, count int) ([]taskstate.OutboxRecord, error)
	AckOutbox(ctx context.Context, prefix, queue, owner string, ttl time.Duration, streamIDs ...string) error
	OutboxLen(ctx context.Context, prefix, queue string) (int64, error)
	OutboxBytes(ctx context.Context, prefix, queue string) (int64, error)
	OutboxFirstRecordBytes(ctx context.Context, prefix, queue string) (int64, error)
	// For Config.WaitReplicas (confirm.go).
	ReadOutboxConfirmed(ctx context.Context, prefix, queue, owner string, ttl time.Duration, after string, count, replicas int, timeout time.Duration) (taskstate.OutboxRead, error)
	OutboxMaster(ctx context.Context, prefix, queue string) (string, error)
	OutboxReplication(ctx context.Context, prefix, queue string) (taskstate.Replication, error)
}

// Config configures a Relay. Zero values mean the defaults.
type Config struct {
	Outbox Outbox
	JS     jetstream.JetStream
	Names  events.Names
	// Owner identifies this replica in outbox leases.
	Owner string
	// Interval between passes when nothing wakes the relay (default 200ms).
	Interval time.Duration
	// LeaseTTL is how long an outbox stays ours without renewal (default
	// DefaultLeaseTTL); every pass that finds records renews it.
	LeaseTTL time.Duration
	// Owns says whether this replica relays queue's outbox (it holds the
	// queue's duties, ownership.Manager.HoldsQueue); nil: every outbox. An
	// outbox it holds the lease of and does not own any more is released
	// at its next pass, for the owner to take.
	Owns func(queue string) bool
	// OrphanAfter: the outbox of a queue this replica does not own is
	// published for one pass when its lease is free and its oldest record
	// has waited longer than this (default DefaultOrphanAfter), so no
	// outbox waits for its owner's shard to move, nor for an owner cut
	// off from NATS. Checked at most every OrphanAfter/4 per outbox.
	OrphanAfter time.Duration
	// Batch is how many records are read and published at once (default 512).
	Batch int
	// BatchesPerPass is how many batches of one outbox a pass publishes
	// while it has them (default 8), for at most a fourth of LeaseTTL
	// shared among the outboxes it holds (each is renewed once a pass, so
	// a pass stays well within a lease term) and not past the start of a
	// burst (Hold). Each batch's Redis reads and
	// deletes overlap the previous or next batch's wait for the stream, so
	// a busy outbox costs fewer round trips per record; 1 publishes one
	// batch per pass and overlaps nothing.
	BatchesPerPass int
	// SizeEvery is how often each outbox's memory is sampled for
	// BacklogBytes (default 1s); passes in between reuse the last sample.
	SizeEvery time.Duration
	// DuplicateWindow is the activity stream's duplicate window; records
	// older than half of it are checked against the stream before they are
	// republished (default 1h, the stream's default).
	DuplicateWindow time.Duration
	// Now is the clock a record's age is read by (default time.Now). A
	// record's time is Redis's, from its stream id: a replica passes its
	// clock corrected to Redis's, so a host clock far behind does not take
	// a record the stream has forgotten for one it still remembers.
	Now func() time.Time
	// PublishTimeout bounds the wait for JetStream's acknowledgements of one
	// batch (default 5s). Records not acknowledged in time stay in the
	// outbox and are published again (the stream drops duplicates), so a
	// pass never hangs on a lost connection and the backlog stays current.
	PublishTimeout time.Duration
	// Hold, when set, is asked before each pass: while it returns true the
	// relay waits (at most MaxHold in a row, so it is never starved). The
	// replica passes the scheduler's Busy: during a burst of fires the
	// relay then leaves the cores and Redis to the fires, and publishes
	// right after. Fires come first even when the relay falls behind: a
	// late event is published later, a late tick past the scheduler's
	// grace is skipped. A relay held for MaxHold in all since it last
	// caught up (a long burst, or a replica with more due than it can fire,
	// busy all along) publishes whole passes beside the fires until
	// its backlog is down to a batch: held at every pass, it published one
	// batch per MaxHold, and the outbox grew until firing paused on its
	// bound.
	Hold    func() bool
	MaxHold time.Duration
	// OnPublished, when set, is called with the event ids of each batch of
	// records once the stream has stored them, in order (a batch record's
	// under its batch id; a multi-record's each). A replica connects to
	// NATS with NoEcho (it does not hear its own publishes back) and
	// learns of the fires it relays here instead: the same news at no cost
	// to NATS or to the process.
	OnPublished func(eventIDs []string)
	// WaitReplicas is how many Redis replicas must acknowledge a batch's
	// records before it is published (confirm.go): 0 none, WaitAuto one
	// on a master that has replicas. WaitTimeout bounds each wait
	// (default DefaultWaitTimeout); a batch not confirmed in time is
	// published marked. WaitProbe is how long a master's batches then go
	// unconfirmed, without a WAIT, before the relay looks again (default
	// DefaultWaitProbe).
	WaitReplicas int
	WaitTimeout  time.Duration
	WaitProbe    time.Duration
	Logger       *slog.Logger
	Metrics      *Metrics
}

// Relay publishes outbox records to the activity stream.
type Relay struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}

	mu    sync.Mutex
	owned map[string]string // queue → last stream id published and acked ("" = from the start)
	// yielded keeps this relay from taking an outbox back until the given
	// time after it failed to publish it, so a relay cut off from NATS
	// hands its outboxes to one that is not.
	yielded map[string]time.Time
	// yields counts the passes in a row that yielded each outbox; the
	// time kept off it doubles with each, up to a lease period.
	yields map[string]int
	// sizes holds each outbox's last memory sample.
	sizes map[string]sizeSample
	// readCounts holds how many records the next read of each outbox asks
	// for (readCount); missing: Batch.
	readCounts map[string]int
	// sizeRefused: Redis refused MEMORY USAGE (said once); sizes are then
	// estimated from record counts.
	sizeRefused bool
	// natsDown: the last pass found the NATS connection down (loop-owned;
	// the change is logged once each way).
	natsDown bool
	// orphanChecked is when each outbox of a queue this replica does not
	// own was last looked at for records nobody relays.
	orphanChecked map[string]time.Time
	// stopping: Stop's flush publishes the outboxes this relay holds or
	// can take, owned or not (its replica has just given up its shards).
	stopping atomic.Bool
	// passBudget is the publishing time of one outbox in the pass under
	// way (set by Pass).
	passBudget atomic.Int64
	// overheld: the relay was held for MaxHold since it last caught up;
	// passes ignore Hold until it catches up (set by the loop, read by
	// passes).
	overheld atomic.Bool

	backlog   atomic.Int64
	published atomic.Uint64
	forgeries atomic.Uint64
	dropped   atomic.Uint64
	// forgeryLogged and forgeriesSince (under mu) bound the forgery
	// warnings to one a minute.
	forgeryLogged  time.Time
	forgeriesSince uint64
	// backlogBytes: the memory the backlog takes in Redis.
	backlogBytes atomic.Int64
	// ownedBacklog is the part of the last pass's backlog in outboxes this
	// relay owns (Flush waits only for those).
	ownedBacklog atomic.Int64

	pubOnce sync.Once
	pub     *batchPublisher

	waits waits

	life lifecycle.Lifecycle
	// passed: a pass has run (the loop's, or a direct Pass or Flush), so
	// Stop has outboxes to flush and leases to release even for a relay
	// never started; handedOver: Stop has done so.
	passed, handedOver atomic.Bool
}

// New validates cfg and returns a relay; Start runs it.
func New(cfg Config) (*Relay, error) {
	if cfg.Outbox == nil || cfg.JS == nil {
		return nil, errors.New("relay: Config.Outbox and Config.JS are required")
	}
	// A negative value is taken as unset too, as it always was.
	cfg.Interval = cmp.Or(max(cfg.Interval, 0), 200*time.Millisecond)
	cfg.LeaseTTL = cmp.Or(max(cfg.LeaseTTL, 0), DefaultLeaseTTL)
	cfg.OrphanAfter = cmp.Or(max(cfg.OrphanAfter, 0), DefaultOrphanAfter)
	cfg.Batch = cmp.Or(max(cfg.Batch, 0), 512)
	cfg.BatchesPerPass = cmp.Or(max(cfg.BatchesPerPass, 0), 8)
	cfg.SizeEvery = cmp.Or(max(cfg.SizeEvery, 0), time.Second)
	cfg.DuplicateWindow = cmp.Or(max(cfg.DuplicateWindow, 0), time.Hour)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.PublishTimeout = cmp.Or(max(cfg.PublishTimeout, 0), 5*time.Second)
	cfg.MaxHold = cmp.Or(max(cfg.MaxHold, 0), 2*time.Second)
	cfg.WaitTimeout = cmp.Or(max(cfg.WaitTimeout, 0), DefaultWaitTimeout)
	cfg.WaitProbe = cmp.Or(max(cfg.WaitProbe, 0), DefaultWaitProbe)
	if cfg.WaitReplicas < WaitAuto {
		return nil, fmt.Errorf("relay: Config.WaitReplicas %d: want 0 or more, or WaitAuto", cfg.WaitReplicas)
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return &Relay{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), owned: map[string]string{}, yielded: map[string]time.Time{}, yields: map[string]int{},
		sizes: map[string]sizeSample{}, readCounts: map[string]int{}, orphanChecked: map[string]time.Time{}}, nil
}

// The outbox lease's defaults (docs/design.md "Time budget").
const (
	// DefaultLeaseTTL: a killed relay's outboxes are free this long after
	// its last pass, so its replica's events reach the stream within 5 s
	// of their fire (the lease, a poll and a pass).
	DefaultLeaseTTL = 3 * time.Second
	// DefaultOrphanAfter: records of an outbox nobody relays wait this
	// long before any relay publishes them.
	DefaultOrphanAfter = 2 * time.Second
)

// Notify wakes the relay: records were just written.
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Backlog returns the number of records waiting in every outbox, as of the
// last pass.
func (r *Relay) Backlog() int64 { return r.backlog.Load() }

// BacklogBytes returns the memory every outbox holding records takes in
// Redis, as of the last pass (each outbox sampled at most every SizeEvery).
func (r *Relay) BacklogBytes() int64 { return r.backlogBytes.Load() }

// Published returns how many records this relay has published.
func (r *Relay) Published() uint64 { return r.published.Load() }

// Dropped returns how many records (or records of a multi-record) this
// relay dropped as undecodable or unroutable.
func (r *Relay) Dropped() uint64 { return r.dropped.Load() }

// drop logs and counts a record dropped: written by our own writers, it is
// a bug, and keeping it would block its outbox for ever.
func (r *Relay) drop(msg string, args ...any) {
	r.dropped.Add(1)
	if m := r.cfg.Metrics; m != nil {
		m.Dropped.Inc()
	}
	r.log.Error(msg, args...)
}

// Forgeries returns how many of its records this relay found displaced in
// the stream by a different message under the same id.
func (r *Relay) Forgeries() uint64 { return r.forgeries.Load() }

// Start runs the relay until Stop and returns at once. Start and Stop
// follow the rules of package lifecycle (a second Start returns
// ErrAlreadyStarted, a Start after Stop ErrStopped).
func (r *Relay) Start(ctx context.Context) error {
	if err := r.life.StartLoop(ctx, r.loop); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// Stop stops the loop, then flushes the outboxes it holds and those no
// relay holds until they are empty or ctx ends, and releases its leases
// so another replica takes over at once. A relay never started hands over what its
// direct passes (Pass, Flush) took, and one that never passed has nothing
// to hand over; a second Stop returns nil at once.
func (r *Relay) Stop(ctx context.Context) error {
	ran := r.life.Stop()
	if (!ran && !r.passed.Load()) || r.handedOver.Swap(true) {
		return nil
	}
	r.stopping.Store(true)
	err := r.Flush(ctx)
	if left := r.backlog.Load(); left > 0 {
		r.log.Warn("relay stopped with records left in the outboxes: another replica's relay publishes them, or the next to start",
			"records", left, "err", err)
	}
	r.mu.Lock()
	queues := make([]string, 0, len(r.owned))
	for q := range r.owned {
		queues = append(queues, q)
	}
	r.owned = map[string]string{}
	r.mu.Unlock()
	for _, q := range queues {
		if rerr := r.cfg.Outbox.ReleaseOutbox(ctx, r.cfg.Names.Prefix(), q, r.cfg.Owner); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	r.pubOnce.Do(func() {}) // orders this read after any publish's setup
	if r.pub != nil {
		r.pub.close()
	}
	return err
}

// Flush runs passes until no outbox holds records, or the records left are
// in outboxes another relay owns (it publishes them), or ctx ends. A failed
// pass is tried once more: one acknowledgement missed under load is common,
// and the records would wait for a replica to start again; two failures in
// a row, or NATS out of reach, end the flush with the error.
func (r *Relay) Flush(ctx context.Context) error {
	failed := false
	for {
		n, err := r.Pass(ctx)
		switch {
		case err == nil:
			failed = false
		case failed || ctx.Err() != nil || errors.Is(err, errDisconnected):
			return err
		default:
			failed = true
			r.log.Debug("relay flush: pass failed, trying once more", "err", err)
			continue
		}
		if r.backlog.Load() == 0 || (n == 0 && r.ownedBacklog.Load() == 0) {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (r *Relay) loop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	var heldSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.wake:
		}
		// heldSince is when the relay was first held since it last caught
		// up: short gaps between a busy scheduler's passes do not start
		// the count again (each gap lets one batch through).
		if !r.overheld.Load() && r.cfg.Hold != nil && r.cfg.Hold() {
			if heldSince.IsZero() {
				heldSince = time.Now()
			}
			if time.Since(heldSince) < r.cfg.MaxHold {
				resetTimer(t, holdPoll)
				continue
			}
			// Held for MaxHold without catching up: whole passes, held
			// no more, until the backlog of its outboxes is down to a batch.
			r.overheld.Store(true)
		}
		n, err := r.Pass(ctx)
		if r.ownedBacklog.Load() <= int64(r.cfg.Batch) {
			heldSince = time.Time{}
			r.overheld.Store(false)
		}
		r.watchNATS()
		switch {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, errDisconnected):
			r.log.Debug("relay pass", "err", err)
		default:
			r.log.Warn("relay pass", "err", err)
		}
		next := r.cfg.Interval
		if n > 0 {
			next = 0 // more may be waiting
		}
		resetTimer(t, next)
	}
}

// holdPoll is how often a held relay asks Hold again.
const holdPoll = 20 * time.Millisecond

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

// Pass visits every outbox once: takes or renews its lease, publishes up to
// one batch, and returns how many records it published.
func (r *Relay) Pass(ctx context.Context) (int, error) {
	r.passed.Store(true)
	prefix := r.cfg.Names.Prefix()
	queues, err := r.cfg.Outbox.OutboxQueues(ctx, prefix)
	if err != nil {
		return 0, fmt.Errorf("list outboxes: %w", err)
	}
	var total int
	var backlog, owned, size int64
	var errs []error
	r.mu.Lock()
	held := max(len(r.owned), 1)
	r.mu.Unlock()
	r.passBudget.Store(int64(r.cfg.LeaseTTL / 4 / time.Duration(held)))
	for _, q := range queues {
		n, left, mine, err := r.drainOne(ctx, q)
		total += n
		backlog += left
		if mine {
			owned += left
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("outbox %q: %w", q, err))
		}
		size += r.outboxBytes(ctx, q, left)
	}
	r.backlog.Store(backlog)
	r.backlogBytes.Store(size)
	r.ownedBacklog.Store(owned)
	if m := r.cfg.Metrics; m != nil {
		m.Backlog.Set(float64(backlog))
		m.BacklogBytes.Set(float64(size))
		r.mu.Lock()
		m.Held.Set(float64(len(r.owned)))
		r.mu.Unlock()
	}
	return total, errors.Join(errs...)
}

// sizeSample is one outbox's memory as last measured.
type sizeSample struct {
	bytes int64
	at    time.Time
}

// outboxBytes returns the memory queue's outbox takes while it holds left
// records: a MEMORY USAGE sample at most every SizeEvery, the last sample in
// between. Where Redis refuses MEMORY USAGE it is estimated from the count
// and the size of the oldest record (estimateBytes).
func (r *Relay) outboxBytes(ctx context.Context, queue string, left int64) int64 {
	r.mu.Lock()
	s, ok := r.sizes[queue]
	refused := r.sizeRefused
	if left <= 0 {
		delete(r.sizes, queue)
	}
	r.mu.Unlock()
	switch {
	case left <= 0:
		return 0
	case ok && time.Since(s.at) < r.cfg.SizeEvery:
		return s.bytes
	case refused:
		return r.estimateBytes(ctx, queue, left)
	}
	b, err := r.cfg.Outbox.OutboxBytes(ctx, r.cfg.Names.Prefix(), queue)
	switch {
	case err == nil:
		r.mu.Lock()
		r.sizes[queue] = sizeSample{bytes: b, at: time.Now()}
		r.mu.Unlock()
		return b
	case errors.Is(err, taskstate.ErrMemoryUsageRefused):
		// An ACL or proxy that refuses the command: say so once, count
		// instead.
		r.mu.Lock()
		r.sizeRefused = true
		r.mu.Unlock()
		if !refused {
			r.log.Warn("Redis refused MEMORY USAGE: outbox sizes estimated from record counts and the size of each outbox's oldest record", "min_bytes_per_record", taskstate.OutboxRecordBytes, "err", err)
		}
		return r.estimateBytes(ctx, queue, left)
	case ok:
		return s.bytes // Redis failed for a moment: the last sample
	}
	return left * taskstate.OutboxRecordBytes
}

// estimateBytes is outboxBytes where Redis refuses MEMORY USAGE: left
// records the size of the outbox's oldest one (a multi-record or a batch
// holds many events), at least OutboxRecordBytes each, sampled as often.
func (r *Relay) estimateBytes(ctx context.Context, queue string, left int64) int64 {
	per := int64(taskstate.OutboxRecordBytes)
	if n, err := r.cfg.Outbox.OutboxFirstRecordBytes(ctx, r.cfg.Names.Prefix(), queue); err == nil {
		per = max(per, n)
	}
	b := left * per
	r.mu.Lock()
	r.sizes[queue] = sizeSample{bytes: b, at: time.Now()}
	r.mu.Unlock()
	return b
}

// errDisconnected: the NATS connection is down; records wait in Redis.
var errDisconnected = errors.New("not connected to NATS: records wait in the outbox")

// drainOne publishes one batch of queue's outbox if this replica owns it,
// and returns the records published, the records left and whether this
// replica owns the outbox.
func (r *Relay) drainOne(ctx context.Context, queue string) (int, int64, bool, error) {
	prefix := r.cfg.Names.Prefix()
	left, err := r.cfg.Outbox.OutboxLen(ctx, prefix, queue)
	if err != nil {
		return 0, 0, false, err
	}
	if left == 0 {
		return 0, 0, false, nil
	}
	after, ok, orphan, err := r.takeOutbox(ctx, queue)
	if !ok {
		return 0, left, false, err
	}
	if orphan {
		// One pass: the queue's owner takes it back at its next.
		defer r.letGo(ctx, queue)
	}
	defer r.keepLease(ctx, queue)()
	count := r.readCount(ctx, queue, left)
	recs, mark, err := r.readBatch(ctx, queue, after, count)
	if errors.Is(err, taskstate.ErrNotOwner) {
		return 0, left, false, nil
	}
	if err != nil || len(recs) == 0 {
		return 0, left, true, err
	}
	// Up to BatchesPerPass batches, one in the stream's hands at a time
	// (so a failure stops the outbox at its first record not stored).
	// While the stream stores one batch, the last one's records are
	// deleted and the next one is read: the Redis round trips of a batch
	// overlap its acknowledgements instead of following them.
	total := 0
	var acked []taskstate.OutboxRecord // published, not yet deleted
	passEnd := time.Now().Add(time.Duration(r.passBudget.Load()))
	for batch := 1; ; batch++ {
		full := len(recs) == count
		sent := r.send(ctx, queue, recs, mark)
		count = r.noteRead(queue, recs, sent.events)
		if aerr := r.ack(ctx, queue, acked); aerr != nil {
			// The outbox is no longer ours: the next owner starts at the
			// first record not deleted, and republishes this batch.
			if n, _ := sent.wait(ctx); n > 0 {
				r.notifyPublished(recs[:n])
			}
			return total, left - int64(total), true, aerr
		}
		total += len(acked)
		acked = nil
		var next []taskstate.OutboxRecord
		var nextMark string
		var nextErr error
		// A burst of fires starting ends the pass after this batch (Hold).
		if sent.stop == nil && sent.sent.err == nil && full && batch < r.cfg.BatchesPerPass && time.Now().Before(passEnd) &&
			(r.cfg.Hold == nil || r.overheld.Load() || !r.cfg.Hold()) {
			next, nextMark, nextErr = r.readBatch(ctx, queue, recs[len(recs)-1].StreamID, count)
		}
		n, err := sent.wait(ctx)
		if n > 0 {
			r.notifyPublished(recs[:n])
		}
		acked = recs[:n]
		if err != nil {
			if m := r.cfg.Metrics; m != nil {
				m.PublishErrors.Inc()
			}
			aerr := r.ack(ctx, queue, acked)
			if aerr == nil {
				total += n
			}
			if total == 0 && ctx.Err() == nil {
				// Nothing got through (NATS unreachable from here, or no
				// stream leader): another replica may do better. A pass cut
				// short by our own stop is no such sign.
				r.yield(ctx, queue)
			}
			return total, left - int64(total), true, errors.Join(err, aerr)
		}
		if nextErr != nil || len(next) == 0 {
			aerr := r.ack(ctx, queue, acked)
			if aerr == nil {
				total += n
			}
			return total, left - int64(total), true, errors.Join(nextErr, aerr)
		}
		recs, mark = next, nextMark
	}
}

// notifyPublished tells OnPublished of the events of recs.
func (r *Relay) notifyPublished(recs []taskstate.OutboxRecord) {
	if r.cfg.OnPublished == nil {
		return
	}
	ids := make([]string, 0, len(recs))
	for _, rec := range recs {
		ids = append(ids, outbox.EventIDs(rec.EventID, rec.Data)...)
	}
	r.cfg.OnPublished(ids)
}

// readBytes bounds what one outbox read asks Redis for: a batch record
// (a mass recovery's) holds about a hundred events, and Batch of them would
// be one Redis call copying tens of megabytes.
const readBytes = 1 << 20

// readCount is how many records the next read of queue's outbox, which
// holds left records, asks for: sized by the last read, or before the first
// by the outbox's memory (a relay starting on a backlog of batches).
func (r *Relay) readCount(ctx context.Context, queue string, left int64) int {
	r.mu.Lock()
	n, ok := r.readCounts[queue]
	r.mu.Unlock()
	if ok {
		return n
	}
	per := r.outboxBytes(ctx, queue, left) / max(left, 1)
	return int(min(int64(r.cfg.Batch), max(readBytes/max(per, 1), 1)))
}

// noteRead sizes the next read of queue's outbox by the records just read,
// which made events messages: Batch records, fewer where they are large (so
// a read stays near readBytes) or hold several messages each (so a read
// publishes about Batch messages, as one of single records does). It
// returns that count.
func (r *Relay) noteRead(queue string, recs []taskstate.OutboxRecord, events int) int {
	size := 0
	for _, rec := range recs {
		size += len(rec.Data)
	}
	n := r.cfg.Batch
	if size > 0 {
		n = min(n, max(readBytes/max(size/len(recs), 1), 1))
	}
	if events > len(recs) {
		n = min(n, max(r.cfg.Batch*len(recs)/events, 1))
	}
	r.mu.Lock()
	r.readCounts[queue] = n
	r.mu.Unlock()
	return n
}

// ack deletes published records from queue's outbox and counts them; on
// failure (the lease lost, or Redis failed) the outbox is no longer ours,
// and the next owner republishes from its first record left (the stream
// drops the duplicates).
func (r *Relay) ack(ctx context.Context, queue string, recs []taskstate.OutboxRecord) error {
	if len(recs) == 0 {
		return nil
	}
	ids := make([]string, len(recs))
	for i := range recs {
		ids[i] = recs[i].StreamID
	}
	if err := r.cfg.Outbox.AckOutbox(ctx, r.cfg.Names.Prefix(), queue, r.cfg.Owner, r.cfg.LeaseTTL, ids...); err != nil {
		r.mu.Lock()
		delete(r.owned, queue)
		r.mu.Unlock()
		return err
	}
	r.mu.Lock()
	if _, still := r.owned[queue]; still {
		r.owned[queue] = ids[len(ids)-1]
	}
	delete(r.yields, queue)
	r.mu.Unlock()
	r.published.Add(uint64(len(recs)))
	if m := r.cfg.Metrics; m != nil {
		m.Published.Add(float64(len(recs)))
	}
	return nil
}
