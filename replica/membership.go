package replica

import (
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
	"github.com/cronstream/cronstream/stall"
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
	// Late are the late entries this replica's stall detector sees, with
	// the reasons its fires failed (at most a few dozen, oldest first).
	Late []stall.Late `json:"late,omitempty"`
}

// DefaultHeartbeat is how often a replica refreshes its heartbeat; a
// replica is considered gone after three missed beats.
const DefaultHeartbeat = 2 * time.Second

// OpenReplicasBucket creates or updates the replicas KV bucket. Keys expire
// after ttl unless refreshed, and expiry leaves a marker so watchers learn
// of it.
func OpenReplicasBucket(ctx context.Context, js jetstream.JetStream, names events.Names, replicas int, ttl time.Duration) (jetstream.KeyValue, error) {
	if replicas <= 0 {
		replicas = 1
	}
	// The server refuses expiry markers kept for less than a second.
	ttl = max(ttl, time.Second)
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         names.ReplicasBucket(),
		Description:    "cronstream live replicas (heartbeats)",
		History:        1,
		TTL:            ttl,
		LimitMarkerTTL: ttl,
		Storage:        jetstream.MemoryStorage,
		Replicas:       replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("replicas bucket %s: %w", names.ReplicasBucket(), err)
	}
	return kv, nil
}

// Membership keeps this replica's heartbeat in the replicas bucket and
// follows everyone's, so the scheduler can hash entries over the live
// replicas. When NATS is unreachable the last known set is kept: replicas
// then fall back on the late-fire delay, never on silence.
type Membership struct {
	kv       jetstream.KeyValue
	self     Info
	interval time.Duration
	log      *slog.Logger
	// Update, when set before Start, refreshes the dynamic fields of this
	// replica's Info before each beat.
	Update func(*Info)

	mu   sync.RWMutex
	live map[string]Info
	seen map[string]time.Time // local receipt time of each replica's last beat

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewMembership prepares the heartbeat of self in kv.
func NewMembership(kv jetstream.KeyValue, self Info, interval time.Duration, log *slog.Logger) *Membership {
	if interval <= 0 {
		interval = DefaultHeartbeat
	}
	if log == nil {
		log = slog.Default()
	}
	return &Membership{kv: kv, self: self, interval: interval, log: log,
		live: map[string]Info{self.ID: self}, seen: map[string]time.Time{self.ID: time.Now()}}
}

// Start writes the first heartbeat and starts beating and watching.
func (m *Membership) Start(ctx context.Context) error {
	if err := m.beat(ctx); err != nil {
		return err
	}
	w, err := m.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch replicas: %w", err)
	}
	ctx, m.cancel = context.WithCancel(context.Background())
	m.wg.Add(2)
	go m.beatLoop(ctx)
	go m.watchLoop(ctx, w)
	return nil
}

// Stop stops beating and removes this replica's heartbeat, so the others
// take over its entries at once rather than after the expiry.
func (m *Membership) Stop(ctx context.Context) {
	if m.cancel != nil {
		m.cancel()
		m.wg.Wait()
	}
	if err := m.kv.Delete(ctx, m.self.ID); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		m.log.Warn("remove heartbeat", "replica", m.self.ID, "err", err)
	}
}

func (m *Membership) beat(ctx context.Context) error {
	if m.Update != nil {
		m.Update(&m.self)
	}
	m.self.Beat = time.Now().UTC()
	b, err := json.Marshal(m.self)
	if err != nil {
		return err
	}
	if _, err := m.kv.Put(ctx, m.self.ID, b); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	m.mu.Lock()
	m.seen[m.self.ID] = time.Now()
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
		case <-t.C:
			bctx, cancel := context.WithTimeout(ctx, m.interval)
			if err := m.beat(bctx); err != nil && ctx.Err() == nil {
				m.log.Warn("heartbeat failed", "replica", m.self.ID, "err", err)
			}
			cancel()
			m.expire()
		}
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
		return // our own view of ourselves is authoritative
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
