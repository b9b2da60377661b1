package replica

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/shardview"
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
	// Every is how often the replica beats (a Go duration); three of them
	// without a beat and it is no longer live. Empty (builds before it):
	// DefaultHeartbeat.
	Every string `json:"every,omitempty"`
	// ConfigSeq is the last config stream sequence the replica's
	// projection applied, so status can show how far each one lags.
	ConfigSeq uint64 `json:"config_seq"`
	// Warnings are this replica's differences between its flags and the
	// existing streams, which it leaves unchanged, and what else it finds
	// wrong with them.
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
	Ownership *shardview.Report `json:"ownership,omitempty"`
	// FireCapacity is the fires per second the replica has shown it can
	// fire (scheduler.Capacity), which sync and entry put compare the
	// schedule's busiest second with; absent while it has shown nothing
	// (unknown), and in earlier builds.
	FireCapacity float64 `json:"fire_capacity,omitempty"`
}

// StaleAfter is how long after its beat a replica stops counting as live:
// three of its heartbeat intervals.
func (i Info) StaleAfter() time.Duration {
	every, err := time.ParseDuration(i.Every)
	if err != nil || every <= 0 {
		every = DefaultHeartbeat
	}
	return 3 * every
}

// DefaultHeartbeat is how often a replica refreshes its heartbeat; a
// replica is considered gone after three missed beats.
const DefaultHeartbeat = 2 * time.Second

// OpenReplicasBucket creates or updates the replicas KV bucket (what
// `cronstream streams apply` does). Keys expire dropAfter after their last
// write, and expiry leaves a marker so watchers learn of it.
func OpenReplicasBucket(ctx context.Context, js jetstream.JetStream, names events.Names, replicas int, dropAfter time.Duration) (jetstream.KeyValue, error) {
	kv, _, err := SyncReplicasBucket(ctx, js, ReplicasBucketConfig(names, replicas, dropAfter), events.Apply)
	return kv, err
}

// Membership keeps this replica's heartbeat in the replicas bucket and
// follows everyone's, so the scheduler can hash entries over the live
// replicas: those whose last beat is younger than three of their
// heartbeats. When NATS is unreachable the others' beats age out:
// replicas then fall back on firing on time themselves, never on
// silence.
//
// The bucket is on file and survives NATS restarts; when it is gone
// anyway (deleted, or an earlier build's bucket in memory lost with NATS),
// a replica never creates it (its NATS user may not): it says so once and
// in Missing, and beats again once `cronstream streams apply` made it.
// Meanwhile no beat arrives, the others age out, and each replica fires
// on time what it would have fired late. A watch that stops delivering
// this replica's own beats is started again.
type Membership struct {
	kv       jetstream.KeyValue // owned by the beat loop once started
	js       jetstream.JetStream
	self     Info
	interval time.Duration
	log      *slog.Logger
	update   func(*Info)
	now      func() time.Time // stamps Beat
	frozen   func() bool      // MembershipConfig.Frozen
	// wasFrozen is whether the view was frozen at the last expire (beat
	// loop only), to log the change.
	wasFrozen bool

	mu   sync.RWMutex
	live map[string]Info
	// seen is when each replica's last beat was written, by the local
	// clock, and stale how long after it the replica stops being live.
	seen  map[string]time.Time
	stale map[string]time.Duration
	// echo is when a watch last delivered this replica's own beat.
	echo time.Time
	// beatAt is when this replica's last heartbeat was stored, by Now:
	// when it last heard NATS.
	beatAt time.Time
	// missing says why the bucket cannot be written ("" when it can).
	missing string

	// Owned by the beat loop: the running watch, and whether the bucket
	// is missing (logged once).
	stopWatch    context.CancelFunc
	watchStarted time.Time
	lost         bool

	// refresh asks the beat loop for a beat now (Refresh).
	refresh chan struct{}

	life lifecycle.Lifecycle
	// wrote: a heartbeat of this replica is in the bucket, for Stop to
	// remove (a Start that failed after its first beat leaves one).
	wrote atomic.Bool
}

// MembershipConfig configures a Membership. Zero values mean the defaults.
type MembershipConfig struct {
	// KV is the replicas bucket (OpenReplicasBucket) and JS the JetStream
	// it is in, which the watch reads; Self is this replica, whose ID is
	// its key there.
	KV   jetstream.KeyValue
	JS   jetstream.JetStream
	Self Info
	// Interval between heartbeats (default DefaultHeartbeat).
	Interval time.Duration
	Logger   *slog.Logger
	// Update, when set, refreshes the dynamic fields of this replica's
	// Info before each beat.
	Update func(*Info)
	// Now stamps each heartbeat's Beat (default time.Now). A replica
	// passes its Redis-corrected clock, so that readers on other hosts
	// compute a beat's age without this host's clock error in it.
	Now func() time.Time
	// Frozen, when set, is a fault for tests (a split view): while it
	// reports true, this replica's view of the others stays as it is, the
	// beats it reads ignored and nobody aging out, while its own beats go
	// on.
	Frozen func() bool
}

// NewMembership validates cfg and prepares the heartbeat of cfg.Self in
// cfg.KV.
func NewMembership(cfg MembershipConfig) (*Membership, error) {
	if cfg.KV == nil || cfg.JS == nil || cfg.Self.ID == "" {
		return nil, errors.New("membership: MembershipConfig.KV, JS and Self.ID are required")
	}
	// A negative interval is taken as unset too, as it always was.
	interval := cmp.Or(max(cfg.Interval, 0), DefaultHeartbeat)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	self := cfg.Self
	self.Every = interval.String()
	if cfg.Frozen == nil {
		cfg.Frozen = func() bool { return false }
	}
	return &Membership{kv: cfg.KV, js: cfg.JS, self: self, interval: interval, log: cmp.Or(cfg.Logger, slog.Default()),
		update: cfg.Update, now: cfg.Now, frozen: cfg.Frozen, refresh: make(chan struct{}, 1),
		live: map[string]Info{self.ID: self}, seen: map[string]time.Time{self.ID: time.Now()},
		stale: map[string]time.Duration{self.ID: 3 * interval}}, nil
}

// Start writes the first heartbeat (ctx bounds it) and starts beating and
// watching until Stop. Start and Stop follow the rules of package
// lifecycle (a second Start returns ErrAlreadyStarted, a Start after Stop
// ErrStopped); a Start that fails may be called again.
func (m *Membership) Start(ctx context.Context) error {
	err := m.life.Start(ctx, func(ctx context.Context) error {
		if err := m.beat(ctx); err != nil {
			return err
		}
		if err := m.watch(m.life.Context()); err != nil {
			return err
		}
		m.life.Go(m.beatLoop)
		return nil
	})
	if errors.Is(err, lifecycle.ErrAlreadyStarted) || errors.Is(err, lifecycle.ErrStopped) {
		return fmt.Errorf("membership: %w", err)
	}
	return err
}

// Stop stops beating and removes this replica's heartbeat (ctx bounds
// that), so the others take over its entries at once rather than after
// three heartbeats; the error says when it could not be removed. Before
// any heartbeat was written, and the second time, it returns nil at once.
func (m *Membership) Stop(ctx context.Context) error {
	ran := m.life.Stop()
	if wrote := m.wrote.Swap(false); !ran && !wrote {
		return nil
	}
	if err := m.kv.Delete(ctx, m.self.ID); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("remove heartbeat of %s: %w", m.self.ID, err)
	}
	return nil
}

// Missing returns why this replica cannot write its heartbeat because the
// replicas bucket is gone, nil while it can.
func (m *Membership) Missing() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.missing == "" {
		return nil
	}
	return errors.New(m.missing)
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
		// Under per-replica NATS users the key (the replica id) is the
		// one the user may write.
		return fmt.Errorf("heartbeat under key %q (the replica id) of bucket %s: %w", m.self.ID, m.kv.Bucket(), err)
	}
	m.wrote.Store(true)
	m.mu.Lock()
	m.seen[m.self.ID] = time.Now()
	m.live[m.self.ID] = m.self
	m.beatAt = m.now()
	m.mu.Unlock()
	return nil
}

func (m *Membership) beatLoop(ctx context.Context) {
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
				m.found(ctx)
			case err == nil:
				m.checkWatch(ctx)
			case ctx.Err() != nil:
			case m.bucketLost(ctx):
				m.markLost(err)
			case !m.lost:
				m.log.Warn("heartbeat failed", "replica", m.self.ID, "err", err)
			}
			m.expire()
		}
	}
}

// bucketLost asks the server, after a failed heartbeat, whether the
// bucket's stream is gone (deleted, or an earlier build's bucket in memory
// lost with NATS), as opposed to NATS being unreachable or slow. The
// failed publish alone does not tell: it times out either way when the
// heartbeat interval is shorter than the client's retries on "no
// responders".
func (m *Membership) bucketLost(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, m.interval)
	defer cancel()
	_, err := m.kv.Status(ctx)
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)
}

// markLost records that the bucket is gone, logging it once.
func (m *Membership) markLost(cause error) {
	if m.lost {
		return
	}
	m.lost = true
	msg := fmt.Sprintf("replicas bucket %s is gone: no replica can beat, so each sees itself alone: it keeps the shards it holds, takes any that go free and hands none over (a lease keeps one holder per shard); this replica beats again once `cronstream streams apply` has made it", m.kv.Bucket())
	m.mu.Lock()
	m.missing = msg
	m.mu.Unlock()
	m.log.Error(msg, "replica", m.self.ID, "err", cause)
}

// found records that the bucket is back: the watch died with the old one.
func (m *Membership) found(ctx context.Context) {
	m.lost = false
	m.mu.Lock()
	m.missing = ""
	m.mu.Unlock()
	m.log.Info("replicas bucket is back; heartbeats resumed", "replica", m.self.ID)
	if err := m.watch(ctx); err != nil {
		m.log.Warn("watch replicas", "replica", m.self.ID, "err", err)
	}
}

// checkWatch starts the watch again when it has not delivered this
// replica's own beats for three intervals: it died with the bucket or
// with its consumer.
func (m *Membership) checkWatch(ctx context.Context) {
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
	m.log.Log(ctx, level, "the replicas watch stopped delivering heartbeats: starting it again", "replica", m.self.ID)
	if err := m.watch(ctx); err != nil {
		m.log.Warn("watch replicas", "replica", m.self.ID, "err", err)
	}
}

// watch starts following the bucket until ctx (the run context) ends, in
// place of the watch running, with a consumer of its own that it never
// deletes (the server removes it once it is no longer read: no role may
// delete consumers).
func (m *Membership) watch(ctx context.Context) error {
	if m.stopWatch != nil {
		m.stopWatch()
	}
	ctx, cancel := context.WithCancel(ctx)
	it, err := readBucket(ctx, m.js, m.kv.Bucket(), m.interval)
	if err != nil {
		cancel()
		return fmt.Errorf("watch replicas: %w", err)
	}
	m.stopWatch, m.watchStarted = cancel, time.Now()
	m.life.Go(func(context.Context) { m.watchLoop(ctx, it) })
	return nil
}

// bucketInactive lets the server remove a bucket reader's consumer once
// it is no longer read.
const bucketInactive = 10 * time.Second

// readBucket reads the last value of every key of the bucket, then what
// is written next, through a consumer of its own. It does not recover from
// a lost message or consumer (the jetstream package's ordered consumer
// does, but inside Next, where no context can stop it while the bucket is
// gone): the Next of the iterator returns an error instead, and the
// membership's watch starts again (checkWatch).
func readBucket(ctx context.Context, js jetstream.JetStream, bucket string, heartbeat time.Duration) (jetstream.MessagesContext, error) {
	cons, err := js.CreateConsumer(ctx, contract.BucketStream(bucket), jetstream.ConsumerConfig{
		FilterSubject:     contract.BucketSubject(bucket, ">"),
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: bucketInactive,
		Replicas:          1,
		MemoryStorage:     true,
	})
	if err != nil {
		return nil, err
	}
	// The server takes idle heartbeats of 500 ms to 30 s.
	return cons.Messages(jetstream.PullHeartbeat(min(max(heartbeat, time.Second), 15*time.Second)), jetstream.WithMessagesErrOnMissingHeartbeat(true))
}

// bucketValue is one message of the bucket: its key, and its value, nil
// when it deletes the key (a delete, a purge, or the marker the bucket
// writes when a key expires).
func bucketValue(bucket string, msg jetstream.Msg) (string, []byte) {
	key := strings.TrimPrefix(msg.Subject(), contract.BucketSubject(bucket, ""))
	h := msg.Headers()
	if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" || h.Get("Nats-Marker-Reason") != "" {
		return key, nil
	}
	return key, msg.Data()
}

func (m *Membership) watchLoop(ctx context.Context, it jetstream.MessagesContext) {
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			// Stopped, or the consumer is lost: checkWatch starts a new
			// one once this replica's beats stop arriving.
			return
		}
		key, value := bucketValue(m.kv.Bucket(), msg)
		m.apply(key, value)
	}
}

// apply takes one replica's heartbeat (value nil: its removal). A beat
// older than three of its intervals is not live: the replica is
// unresponsive.
func (m *Membership) apply(key string, value []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if key == m.self.ID {
		m.echo = time.Now() // the watch works
		return              // our own view of ourselves is authoritative
	}
	if m.frozen() {
		return
	}
	if value == nil {
		delete(m.live, key)
		delete(m.seen, key)
		delete(m.stale, key)
		return
	}
	var info Info
	if err := json.Unmarshal(value, &info); err != nil || info.ID != key {
		return
	}
	age := max(m.now().Sub(info.Beat), 0)
	m.seen[info.ID], m.stale[info.ID] = time.Now().Add(-age), info.StaleAfter()
	if age > info.StaleAfter() {
		delete(m.live, info.ID)
		return
	}
	m.live[info.ID] = info
}

// expire drops from the live replicas those whose beat has not been seen
// for three of their intervals.
func (m *Membership) expire() {
	if frozen := m.frozen(); frozen != m.wasFrozen {
		m.wasFrozen = frozen
		if frozen {
			m.log.Warn("test only: this replica's view of the other replicas is frozen (a split view)", "replica", m.self.ID, "live", len(m.Live()))
		} else {
			m.log.Info("test only: this replica's view of the other replicas follows their heartbeats again", "replica", m.self.ID)
		}
	}
	if m.wasFrozen {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, at := range m.seen {
		if id != m.self.ID && time.Since(at) > m.stale[id] {
			delete(m.seen, id)
			delete(m.stale, id)
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

// ErrNoReplicasBucket is ListReplicas' error when the bucket does not
// exist.
var ErrNoReplicasBucket = errors.New("replicas bucket does not exist")

// ListReplicas reads every heartbeat in the replicas bucket of names (for
// status): live replicas, and those that stopped beating and are not
// dropped yet (compare each Beat with its StaleAfter).
func ListReplicas(ctx context.Context, js jetstream.JetStream, names events.Names) ([]Info, error) {
	bucket := names.ReplicasBucket()
	s, err := js.Stream(ctx, names.ReplicasStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %s (run `cronstream streams apply`)", ErrNoReplicasBucket, bucket)
	}
	if err != nil {
		return nil, err
	}
	// The keys to read: a consumer's count of what it has left to deliver
	// can reach 0 before a key whose last beat was replaced while it read
	// (a newer beat, later in the stream) comes, so the read also waits
	// for every key the bucket held before it began.
	si, err := s.Info(ctx, jetstream.WithSubjectFilter(contract.BucketSubject(bucket, ">")))
	if err != nil {
		return nil, err
	}
	if si.State.Msgs == 0 {
		return nil, nil
	}
	unseen := make(map[string]bool, len(si.State.Subjects))
	for subject := range si.State.Subjects {
		unseen[strings.TrimPrefix(subject, contract.BucketSubject(bucket, ""))] = true
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	it, err := readBucket(rctx, js, bucket, DefaultHeartbeat)
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	byID := map[string]Info{}
	caughtUp := false // the consumer said it had nothing left
	for {
		wait := ctx
		cancelWait := context.CancelFunc(func() {})
		if caughtUp {
			// A key listed before the read and not delivered since was
			// dropped meanwhile (its replica gone past the bucket's age),
			// or its newer beat is on the way: a beat interval settles it.
			wait, cancelWait = context.WithTimeout(ctx, DefaultHeartbeat)
		}
		msg, err := it.Next(jetstream.NextContext(wait))
		cancelWait()
		if caughtUp && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			break
		}
		if err != nil {
			return nil, err
		}
		md, err := msg.Metadata()
		if err != nil {
			return nil, err
		}
		key, value := bucketValue(bucket, msg)
		delete(unseen, key)
		var info Info
		switch {
		case value == nil:
			delete(byID, key)
		case json.Unmarshal(value, &info) == nil && info.ID == key:
			byID[key] = info
		}
		caughtUp = caughtUp || md.NumPending == 0
		if caughtUp && len(unseen) == 0 {
			break
		}
	}
	out := make([]Info, 0, len(byID))
	for _, info := range byID {
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
