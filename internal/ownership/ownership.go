// Package ownership decides which shards of entries this replica fires
// (docs/design.md "Ownership"). Each shard (a queue and an index,
// events.ShardOf) has one owner at a time, held by a lease in the queue's
// Redis slot; every replica reads all leases every LeasePoll, computes the
// desired owner of each shard from the membership (consistent hashing with
// bounded loads over the ready replicas), and acquires, renews and
// releases its own leases by the rank rule: the desired owner takes a free
// shard at once, the others one TakeoverStep per rank later, counting
// only the candidates ahead that hold a lease (liveRank).
//
// One loop owns the manager's state; the scheduler reads the owned set
// (Owned) between its passes and reports each turn (Turned). A lease is a
// performance device, never a safety one: the scheduler's fires are
// compare-and-set in Redis whoever owns what.
package ownership

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// The time budget of ownership (docs/design.md "Time budget"), each
// overridable in Config.
const (
	// DefaultLeaseTTL: a killed owner's shards are free this long after
	// its last renewal; a lease is renewed every third of it.
	DefaultLeaseTTL = 3 * time.Second
	// DefaultLeasePoll: how often every replica reads every lease.
	DefaultLeasePoll = 500 * time.Millisecond
	// DefaultTakeoverStep: a replica of live rank r takes a free shard
	// once it was seen free for r steps.
	DefaultTakeoverStep = 500 * time.Millisecond
	// DefaultHandoverSettle: a replica hands a shard over to its desired
	// owner once its view of the membership held still this long.
	DefaultHandoverSettle = 2 * time.Second
	// DefaultNATSLostAfter: a replica that has not heard NATS for this
	// long stops renewing while another replica still hears it.
	DefaultNATSLostAfter = 4 * time.Second
	// DefaultMemberTTL: how long a replica stays in the others' views
	// after its last heartbeat (three beats). A shard taken over is kept
	// at least this long, so a dead desired owner still in the views
	// does not draw it back and forth.
	DefaultMemberTTL = 6 * time.Second
	// DefaultUnownedReadyAfter: shards this replica should own that
	// nobody held for this long make it not ready.
	DefaultUnownedReadyAfter = 30 * time.Second
	// FencedFor: a replica every fire of which the fences refused for
	// this long (scheduler.Fenced: it fires from a configuration the
	// slots outgrew) is not ready to own shards, so they go to replicas
	// that fire them, well within the catch-up grace.
	FencedFor = 2 * time.Second
)

// Store is the Redis side of ownership; *taskstate.Store implements it.
type Store interface {
	ShardLeases(ctx context.Context, prefix string, queues []string, heard bool) (taskstate.ShardLeaseView, error)
	AcquireShardLeases(ctx context.Context, prefix, owner string, ttl time.Duration, shards []events.Shard) ([]taskstate.LeaseResult, error)
	RenewShardLeases(ctx context.Context, prefix, owner string, ttl time.Duration, shards []events.Shard) ([]taskstate.LeaseResult, error)
	ReleaseShardLeases(ctx context.Context, prefix, owner string, shards []events.Shard) ([]taskstate.LeaseResult, error)
	NoteNATSHeard(ctx context.Context, prefix, replica string, at time.Time) error
}

// Members is the membership as ownership needs it; *replica.Membership
// implements it.
type Members interface {
	// Candidates are the live replicas that may own shards (ready, and of
	// a build that owns shards), sorted.
	Candidates() []string
	// Live are all live replicas, sorted.
	Live() []string
}

// Config configures a Manager. Zero values mean the defaults.
type Config struct {
	Store     Store
	Members   Members
	Names     events.Names
	ReplicaID string
	// Queues lists the queues whose shards are owned (Projector.Queues).
	Queues func() []string
	// Ready reports whether this replica may own shards: its projection
	// is caught up with the config stream, and its fires are not all
	// refused by the fences (FencedFor). The heartbeat says the same, so
	// the other replicas count it out too.
	Ready func() bool
	// HeardNATS is when this replica last heard NATS, on the
	// Redis-corrected clock (its last heartbeat stored).
	HeardNATS func() time.Time
	// Clock measures durations (monotonic) and stamps HeardNATS's
	// comparison (default clock.Local()).
	Clock *clock.Clock

	LeaseTTL          time.Duration
	LeasePoll         time.Duration
	TakeoverStep      time.Duration
	HandoverSettle    time.Duration
	NATSLostAfter     time.Duration
	MemberTTL         time.Duration
	UnownedReadyAfter time.Duration

	Logger  *slog.Logger
	Metrics *Metrics
}

// Manager is one replica's ownership loop. It implements scheduler.Shards.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	m     *Metrics
	clock *clock.Clock
	epoch clock.Mono

	// Loop-owned.
	held map[events.Shard]*holding
	free map[events.Shard]clock.Mono // when each free shard was first seen free
	// released: the free shard's last lease went before its term (its
	// holder released it); else it lapsed.
	released map[events.Shard]bool
	// last is the last lease seen of each shard, kept while it is free.
	last    map[events.Shard]taskstate.ShardLease
	cands   []string
	queues  []string
	shards  []events.Shard
	viewAt  clock.Mono // when cands or queues last changed
	assign  assignment
	version uint64
	watch   watchState

	owned atomic.Pointer[schedule.OwnedShards]
	// duties is the duty view (duties.go), published with owned;
	// dutyQueues and global what it held last (loop-owned).
	duties     atomic.Pointer[dutyView]
	dutyQueues []string
	global     bool
	// viewed: the loop has computed the shard set at least once.
	viewed bool
	// turn is when the scheduler's loop last turned (since epoch), and
	// applied the version of the set it then held.
	turn    atomic.Int64
	applied atomic.Uint64
	report  atomic.Pointer[Report]
	// Moves counted since start, for the report.
	handedIn, handedOut, tookOver atomic.Uint64

	mu   sync.Mutex
	subs []chan struct{}

	life lifecycle.Lifecycle
}

// holding is a shard whose lease this replica holds (loop-owned).
type holding struct {
	acquired clock.Mono // when this replica took it
	renewed  clock.Mono // when the call that last took or renewed it began
	// takeover: taken while another replica was its desired owner.
	takeover bool
	// releasing is the version of the owned set without it (0: kept):
	// released once the scheduler holds that version; handover says it
	// goes to its desired owner (rather than because this replica may
	// own nothing).
	releasing uint64
	handover  bool
}

// New returns a manager; Start runs it.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Members == nil || cfg.Queues == nil || cfg.ReplicaID == "" {
		return nil, errors.New("ownership: Store, Members, Queues and ReplicaID are required")
	}
	cfg.LeaseTTL = cmp.Or(max(cfg.LeaseTTL, 0), DefaultLeaseTTL)
	cfg.LeasePoll = cmp.Or(max(cfg.LeasePoll, 0), DefaultLeasePoll)
	cfg.TakeoverStep = cmp.Or(max(cfg.TakeoverStep, 0), DefaultTakeoverStep)
	cfg.HandoverSettle = cmp.Or(max(cfg.HandoverSettle, 0), DefaultHandoverSettle)
	cfg.NATSLostAfter = cmp.Or(max(cfg.NATSLostAfter, 0), DefaultNATSLostAfter)
	cfg.MemberTTL = cmp.Or(max(cfg.MemberTTL, 0), DefaultMemberTTL)
	cfg.UnownedReadyAfter = cmp.Or(max(cfg.UnownedReadyAfter, 0), DefaultUnownedReadyAfter)
	if cfg.Ready == nil {
		cfg.Ready = func() bool { return true }
	}
	if cfg.HeardNATS == nil {
		cfg.HeardNATS = func() time.Time { return time.Time{} }
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Local()
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	mg := &Manager{cfg: cfg, log: cfg.Logger, m: m, clock: cfg.Clock, epoch: cfg.Clock.Mono(),
		held: map[events.Shard]*holding{}, free: map[events.Shard]clock.Mono{}, released: map[events.Shard]bool{},
		last: map[events.Shard]taskstate.ShardLease{}}
	mg.owned.Store(&schedule.OwnedShards{Until: map[events.Shard]clock.Mono{}})
	mg.report.Store(&Report{})
	return mg, nil
}

// Start runs the loop until Stop and returns at once; the first poll runs
// right away. Start and Stop follow the rules of package lifecycle (a
// second Start returns ErrAlreadyStarted, a Start after Stop ErrStopped).
func (m *Manager) Start(ctx context.Context) error {
	err := m.life.Start(ctx, func(context.Context) error {
		m.Turned(0) // the scheduler's loop gets a lease term to turn
		m.life.Go(m.loop)
		return nil
	})
	if err != nil {
		return fmt.Errorf("ownership: %w", err)
	}
	return nil
}

// Stop stops the loop and releases every lease this replica holds (ctx
// bounds that), so their next owners take them at once. Stop the
// scheduler first: a lease released under a fire pass in flight is safe
// (the compare-and-set decides) but costs the next owner refusals.
func (m *Manager) Stop(ctx context.Context) error {
	if !m.life.Stop() {
		return nil
	}
	shards := make([]events.Shard, 0, len(m.held))
	for s := range m.held {
		shards = append(shards, s)
	}
	m.held = map[events.Shard]*holding{}
	m.publish(true)
	if len(shards) == 0 {
		return nil
	}
	slices.SortFunc(shards, events.Shard.Compare)
	if _, err := m.cfg.Store.ReleaseShardLeases(ctx, m.cfg.Names.Prefix(), m.cfg.ReplicaID, shards); err != nil {
		return err
	}
	m.log.Info("shard leases released", "shards", len(shards))
	return nil
}

// Owned returns the shards this replica holds (scheduler.Shards).
func (m *Manager) Owned() schedule.OwnedShards { return *m.owned.Load() }

// Changed returns a channel signalled after the owned set changed
// (scheduler.Shards). Each call returns a channel of its own, so every
// component that follows ownership gets every change.
func (m *Manager) Changed() <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.subs = append(m.subs, ch)
	m.mu.Unlock()
	return ch
}

// Turned records a turn of the scheduler's loop (scheduler.Shards).
func (m *Manager) Turned(version uint64) {
	m.turn.Store(int64(max(m.clock.Since(m.epoch), 1)))
	m.applied.Store(version)
}

// loop polls every LeasePoll, counted from the start of each poll. The
// timer is armed again only once a poll is done: on a manual clock
// (clock.Manual) that says the poll of this instant is over.
func (m *Manager) loop(ctx context.Context) {
	t := m.clock.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := m.clock.Mono()
		m.poll(ctx)
		t.Reset(max(m.clock.Until(began.Add(m.cfg.LeasePoll)), 0))
	}
}

// publish stores the owned set for the scheduler; changed says the set
// changed (a new version, and the followers are signalled) rather than
// only the validity of its leases.
func (m *Manager) publish(changed bool) {
	until := make(map[events.Shard]clock.Mono, len(m.held))
	for s, h := range m.held {
		if h.releasing == 0 {
			until[s] = m.validUntil(h)
		}
	}
	if changed {
		m.version++
	}
	m.owned.Store(&schedule.OwnedShards{Version: m.version, Until: until})
	m.m.Owned.Set(float64(m.validCount()))
	m.publishDuties(until)
	if !changed {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ch := range m.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// validCount counts the shards whose leases this replica holds and may
// fire by its clock. A shard stays in held while its lease lapses unrenewed
// (cut off, or the loop stuck) and nobody takes it, so it is taken again
// without a change of the owned set; it is not owned meanwhile.
func (m *Manager) validCount() int {
	now, n := m.clock.Mono(), 0
	for _, h := range m.held {
		if h.releasing == 0 && now.Before(m.validUntil(h)) {
			n++
		}
	}
	return n
}

// validUntil is until when h's lease is surely still valid by the local
// clock: its term from the start of the call that last took or renewed
// it, less a margin for the difference between this host's clock rate and
// Redis's.
func (m *Manager) validUntil(h *holding) clock.Mono {
	return h.renewed.Add(m.cfg.LeaseTTL - m.cfg.LeaseTTL/6)
}
