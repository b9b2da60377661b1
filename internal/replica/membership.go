package replica

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/stall"
)

// Info is what a replica says about itself in its heartbeat.
type Info struct {
	ID      string    `json:"id"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Version string    `json:"version,omitempty"`
	HTTP    string    `json:"http,omitempty"`
	// Beat is when the heartbeat was written, by the writer's clock.
	Beat time.Time `json:"beat"`
	// ConfigSeq is the last config stream sequence the replica's
	// projection applied, so status can show how far each one lags.
	ConfigSeq uint64 `json:"config_seq"`
	// Warnings are this replica's differences between its flags and the
	// existing streams, which it leaves unchanged.
	Warnings []string `json:"warnings,omitempty"`
	// Late are the late entries this replica's stall detector sees, with
	// the reasons its fires failed (at most a few dozen, oldest first).
	Late []stall.Late `json:"late,omitempty"`
	// RedisWait is what its relay knows of Redis replication: how many
	// replicas confirm each batch, and whether events go out unconfirmed.
	RedisWait *relay.WaitStatus `json:"redis_wait,omitempty"`
	// Shards says the replica fires by shard ownership (docs/design.md
	// "Ownership"); replicas of earlier builds lack it and are never
	// given shards. Ready says its projection is caught up with the
	// config stream: only ready replicas are given shards.
	Shards bool `json:"shards,omitempty"`
	Ready  bool `json:"ready,omitempty"`
	// Ownership is what the replica owns and sees of the shard leases,
	// for status.
	Ownership *ownership.Report `json:"ownership,omitempty"`
}

// DefaultHeartbeat is how often a replica refreshes its heartbeat; a
// replica is considered gone after three missed beats.
const DefaultHeartbeat = 2 * time.Second

// OpenReplicasBucket creates or updates the replicas KV bucket. Keys expire
// after ttl unless refreshed, and expiry leaves a marker so watchers learn
// of it.
func OpenReplicasBucket(ctx context.Context, js jetstream.JetStream, names events.Names, replicas int, ttl time.Duration) (jetstream.KeyValue, error) {
	kv, _, err := SyncReplicasBucket(ctx, js, ReplicasBucketConfig(names, replicas, ttl), events.Apply)
	return kv, err
}

// Membership keeps this replica's heartbeat in the replicas bucket and
// follows everyone's, so the scheduler can hash entries over the live
// replicas. When NATS is unreachable the last known set is kept: replicas
// then fall back on the late-fire delay, never on silence.
//
// The bucket lives in memory: a restart of NATS (every node) loses it, and
// an operator may delete it. A beat that finds no bucket re-creates it with
// Reopen, and a watch that stops delivering this replica's own beats is
// started again, so membership comes back within a few heartbeats.
type Membership struct {
	kv       jetstream.KeyValue // owned by the beat loop once started
	self     Info
	interval time.Duration
	log      *slog.Logger
	update   func(*Info)
	reopen   func(context.Context) (jetstream.KeyValue, error)
	now      func() time.Time // stamps Beat

	mu   sync.RWMutex
	live map[string]Info
	seen map[string]time.Time // local receipt time of each replica's last beat
	// echo is when a watch last delivered this replica's own beat.
	echo time.Time
	// beatAt is when this replica's last heartbeat was stored, by Now:
	// when it last heard NATS.
	beatAt time.Time

	// Owned by the beat loop: the running watch, and the backoff of
	// re-creating a lost bucket.
	stopWatch    context.CancelFunc
	watchStarted time.Time
	lost         bool // the bucket is missing; logged once
	reopenAfter  time.Time
	reopenWait   time.Duration

	// refresh asks the beat loop for a beat now (Refresh).
	refresh chan struct{}

	ctx    context.Context // the loops' context, from Start to Stop
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// MembershipConfig configures a Membership. Zero values mean the defaults.
type MembershipConfig struct {
	// KV is the replicas bucket (OpenReplicasBucket); Self is this
	// replica, whose ID is its key there.
	KV   jetstream.KeyValue
	Self Info
	// Interval between heartbeats (default DefaultHeartbeat).
	Interval time.Duration
	Logger   *slog.Logger
	// Update, when set, refreshes the dynamic fields of this replica's
	// Info before each beat.
	Update func(*Info)
	// Reopen, when set, creates the bucket again after it was lost
	// (OpenReplicasBucket with the start-up settings).
	Reopen func(context.Context) (jetstream.KeyValue, error)
	// Now stamps each heartbeat's Beat (default time.Now). A replica
	// passes its Redis-corrected clock, so that readers on other hosts
	// compute a beat's age without this host's clock error in it.
	Now func() time.Time
}

// NewMembership validates cfg and prepares the heartbeat of cfg.Self in
// cfg.KV.
func NewMembership(cfg MembershipConfig) (*Membership, error) {
	if cfg.KV == nil || cfg.Self.ID == "" {
		return nil, errors.New("membership: MembershipConfig.KV and Self.ID are required")
	}
	// A negative interval is taken as unset too, as it always was.
	interval := cmp.Or(max(cfg.Interval, 0), DefaultHeartbeat)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	self := cfg.Self
	return &Membership{kv: cfg.KV, self: self, interval: interval, log: cmp.Or(cfg.Logger, slog.Default()),
		update: cfg.Update, reopen: cfg.Reopen, now: cfg.Now, refresh: make(chan struct{}, 1),
		live: map[string]Info{self.ID: self}, seen: map[string]time.Time{self.ID: time.Now()}}, nil
}

// Start writes the first heartbeat (ctx bounds it) and starts beating and
// watching, on a context of their own (ctx's values, not its end) that
// Stop cancels.
func (m *Membership) Start(ctx context.Context) error {
	if err := m.beat(ctx); err != nil {
		return err
	}
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := m.watch(); err != nil {
		m.cancel()
		return err
	}
	m.wg.Add(1)
	go m.beatLoop(m.ctx)
	return nil
}

// watch starts following the bucket, in place of the watch running.
func (m *Membership) watch() error {
	if m.stopWatch != nil {
		m.stopWatch()
	}
	ctx, cancel := context.WithCancel(m.ctx)
	w, err := m.kv.WatchAll(ctx)
	if err != nil {
		cancel()
		return fmt.Errorf("watch replicas: %w", err)
	}
	m.stopWatch, m.watchStarted = cancel, time.Now()
	m.wg.Add(1)
	go m.watchLoop(ctx, w)
	return nil
}

// Stop stops beating and removes this replica's heartbeat (ctx bounds
// that), so the others take over its entries at once rather than after the
// expiry; the error says when it could not be removed.
func (m *Membership) Stop(ctx context.Context) error {
	if m.cancel != nil {
		m.cancel()
		m.wg.Wait()
	}
	if err := m.kv.Delete(ctx, m.self.ID); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("remove heartbeat of %s: %w", m.self.ID, err)
	}
	return nil
}

func (m *Membership) beat(ctx context.Context) error {
	if m.update != nil {
		m.update(&m.self)
	}
	m.self.Beat = m.now().UTC()
	b, err := json.Marshal(m.self)
	if err != nil {
		return err
	}
	if _, err := m.kv.Put(ctx, m.self.ID, b); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	m.mu.Lock()
	m.seen[m.self.ID] = time.Now()
	m.live[m.self.ID] = m.self
	m.beatAt = m.now()
	m.mu.Unlock()
	return nil
}

func (m *Membership) beatLoop(ctx context.Context) {
	defer m.wg.Done()
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.refresh:
			// Readiness changed: say so now; failures are the next
			// interval's to handle.
			bctx, cancel := context.WithTimeout(ctx, m.interval)
			if err := m.beat(bctx); err != nil && ctx.Err() == nil {
				m.log.Debug("heartbeat", "replica", m.self.ID, "err", err)
			}
			cancel()
		case <-t.C:
			bctx, cancel := context.WithTimeout(ctx, m.interval)
			err := m.beat(bctx)
			cancel()
			switch {
			case err == nil && m.lost:
				// Another replica re-created the bucket first: the watch
				// died with the old one.
				m.lost = false
				m.log.Info("replicas bucket is back; heartbeats resumed", "replica", m.self.ID)
				if err := m.watch(); err != nil {
					m.log.Warn("watch replicas", "replica", m.self.ID, "err", err)
				}
			case err == nil:
				m.checkWatch()
			case ctx.Err() != nil:
			case m.bucketLost(ctx):
				m.recreate(ctx, err)
			case !m.lost:
				m.log.Warn("heartbeat failed", "replica", m.self.ID, "err", err)
			}
			m.expire()
		}
	}
}

// bucketLost asks the server, after a failed heartbeat, whether the
// bucket's stream is gone (NATS restarted, or the bucket was deleted), as
// opposed to NATS being unreachable or slow. The failed publish alone does
// not tell: it times out either way when the heartbeat interval is shorter
// than the client's retries on "no responders".
func (m *Membership) bucketLost(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, m.interval)
	defer cancel()
	_, err := m.kv.Status(ctx)
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)
}

// recreate creates the lost bucket again (at most once per backoff, which
// grows to 30 s while it fails), beats into it and starts a new watch. It
// logs once when the bucket is found missing and once when it is back.
func (m *Membership) recreate(ctx context.Context, cause error) {
	if !m.lost {
		m.lost = true
		m.reopenWait = m.interval
		if m.reopen == nil {
			m.log.Warn("replicas bucket is gone (NATS restarted or the bucket was deleted): keeping the last known replicas until another replica re-creates it",
				"replica", m.self.ID, "err", cause)
		} else {
			m.log.Warn("replicas bucket is gone (NATS restarted or the bucket was deleted): re-creating it; until then the last known replicas are kept",
				"replica", m.self.ID, "err", cause)
		}
	}
	if m.reopen == nil || time.Now().Before(m.reopenAfter) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.interval)
	defer cancel()
	kv, err := m.reopen(ctx)
	if err == nil {
		m.kv = kv
		err = m.beat(ctx)
	}
	if err == nil {
		err = m.watch()
	}
	if err != nil {
		m.reopenAfter = time.Now().Add(m.reopenWait)
		m.reopenWait = min(2*m.reopenWait, 30*time.Second)
		m.log.Debug("re-create the replicas bucket", "replica", m.self.ID, "err", err, "retry_in", m.reopenWait)
		return
	}
	m.lost = false
	m.log.Info("replicas bucket re-created; heartbeats resumed", "replica", m.self.ID)
}

// checkWatch starts the watch again when it has not delivered this
// replica's own beats for three intervals: it died with the bucket (another
// replica re-created it first) or with its consumer.
func (m *Membership) checkWatch() {
	m.mu.RLock()
	echo := m.echo
	m.mu.RUnlock()
	delivered := echo.After(m.watchStarted)
	if time.Since(maxTime(echo, m.watchStarted)) <= 3*m.interval {
		return
	}
	// Logged when a watch that worked stops; a new one that does not
	// deliver yet is retried quietly.
	level := slog.LevelDebug
	if delivered {
		level = slog.LevelWarn
	}
	m.log.Log(context.Background(), level, "the replicas watch stopped delivering heartbeats: starting it again", "replica", m.self.ID)
	if err := m.watch(); err != nil {
		m.log.Warn("watch replicas", "replica", m.self.ID, "err", err)
	}
}

func (m *Membership) watchLoop(ctx context.Context, w jetstream.KeyWatcher) {
	defer m.wg.Done()
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil { // end of the initial values
				continue
			}
			m.apply(e)
		}
	}
}

func (m *Membership) apply(e jetstream.KeyValueEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Key() == m.self.ID {
		m.echo = time.Now() // the watch works
		return              // our own view of ourselves is authoritative
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(m.live, e.Key())
		delete(m.seen, e.Key())
		return
	}
	var info Info
	if err := json.Unmarshal(e.Value(), &info); err != nil || info.ID != e.Key() {
		return
	}
	m.live[info.ID] = info
	m.seen[info.ID] = time.Now()
}

// expire drops replicas whose beat has not been seen for three intervals,
// in case the bucket's expiry marker was missed.
func (m *Membership) expire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, at := range m.seen {
		if id != m.self.ID && time.Since(at) > 3*m.interval {
			delete(m.seen, id)
			delete(m.live, id)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Live returns the ids of the live replicas, sorted, this one included.
func (m *Membership) Live() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ids := make([]string, 0, len(m.live))
	for id := range m.live {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Refresh makes the beat loop write a heartbeat now rather than at its
// next interval (the replica's readiness changed); it never blocks.
func (m *Membership) Refresh() {
	select {
	case m.refresh <- struct{}{}:
	default:
	}
}

// Candidates returns the ids of the live replicas that may be given shards
// (Info.Shards and Info.Ready, as their last beat said, this one's
// included), sorted.
func (m *Membership) Candidates() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ids := make([]string, 0, len(m.live))
	for id, info := range m.live {
		if info.Shards && info.Ready {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// LastBeat is when this replica's last heartbeat was stored (by
// MembershipConfig.Now; zero before the first): the last time it surely
// heard NATS.
func (m *Membership) LastBeat() time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.beatAt
}

// ListReplicas reads every heartbeat in the bucket (for status).
func ListReplicas(ctx context.Context, kv jetstream.KeyValue) ([]Info, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Info
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // expired between listing and reading
		}
		var info Info
		if json.Unmarshal(e.Value(), &info) == nil {
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
