package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Publishing only what Redis's replicas hold (docs/exactly-once.md,
// step 8). A fire's event published before its
// write reached a replica describes a task that a failover to that replica
// loses. So with WaitReplicas set, each batch is read with
// taskstate.ReadOutboxConfirmed, which WAITs on the master of the outbox's
// slot until that many replicas acknowledged every record read.
//
// A replica outage must not stop the events, nor slow every batch by the
// WAIT's timeout: a batch whose WAIT falls short is published anyway,
// marked (the events.HeaderRedisUnconfirmed header: the stored data and
// the Nats-Msg-Id stay what they are, so duplicate detection and the
// forgery check are unchanged, and earlier readers ignore the header) and
// counted. Its master is then behind: its batches are published marked
// without a WAIT until the next probe (Config.WaitProbe), which first asks the
// master how many replicas are online (INFO replication) and WAITs only
// when enough are; a WAIT that confirms ends the outage.

// WaitAuto is the WaitReplicas that waits for one replica on every master
// that has had one since the relay started (INFO replication), and for
// none on a master that never had any.
const WaitAuto = -1

// DefaultWaitTimeout is Config.WaitTimeout's default.
const DefaultWaitTimeout = time.Second

// DefaultWaitProbe is Config.WaitProbe's default: while a master's
// replicas are behind, at most one WAIT timeout per probe, and one INFO
// while they are down.
const DefaultWaitProbe = 10 * time.Second

const (
	// refusedProbe is WaitProbe for a master that refuses WAIT.
	refusedProbe = time.Minute
	// autoRefresh is how often WaitAuto reads a master's replicas.
	autoRefresh = 30 * time.Second
)

// Why a batch went unconfirmed (the reason in its header).
const (
	unconfirmedTimeout = "timeout" // its WAIT timed out
	unconfirmedBehind  = "behind"  // an earlier WAIT did: not waited for
	unconfirmedRefused = "refused" // Redis refuses WAIT
)

// WaitStatus is what the relay knows of Redis replication, for status.
type WaitStatus struct {
	// Replicas is how many replicas a batch waits for (the most over the
	// masters seen); 0 when none.
	Replicas int `json:"replicas"`
	// Behind: some master's replicas did not confirm the last batches,
	// since Since, for Reason; their events are published marked.
	Behind bool      `json:"behind,omitempty"`
	Since  time.Time `json:"since,omitempty"`
	Reason string    `json:"reason,omitempty"`
	// Unconfirmed counts the events this relay published marked.
	Unconfirmed uint64 `json:"unconfirmed,omitempty"`
}

// masterWait is what the relay knows of one master's replicas.
type masterWait struct {
	seen      bool      // WaitAuto: a replica was connected at some read
	online    int       // replicas online at the last read (-1: unknown)
	checkedAt time.Time // when INFO was last read
	behind    bool
	probeAt   time.Time // behind: when to look again
	since     time.Time
	reason    string
	acked     int
}

// waits holds the relay's masterWaits (under mu: passes and Stop's flush
// may overlap).
type waits struct {
	mu      sync.Mutex
	masters map[string]*masterWait
	// logged and since bound the warning about unconfirmed events to one
	// a minute.
	logged time.Time
	since  uint64
	total  uint64
}

// readBatch reads up to count records of queue's outbox after stream id
// after and returns them with the header value that marks them, "" when
// the replicas confirmed them or none is waited for. A relay that lost
// the outbox's lease forgets it and gets taskstate.ErrNotOwner.
func (r *Relay) readBatch(ctx context.Context, queue, after string, count int) ([]taskstate.OutboxRecord, string, error) {
	prefix := r.cfg.Names.Prefix()
	if r.cfg.WaitReplicas == 0 {
		recs, err := r.cfg.Outbox.ReadOutbox(ctx, prefix, queue, after, count)
		return recs, "", err
	}
	master, err := r.cfg.Outbox.OutboxMaster(ctx, prefix, queue)
	if err != nil {
		return nil, "", err
	}
	want, wait := r.planWait(ctx, master, queue)
	if want == 0 {
		recs, err := r.cfg.Outbox.ReadOutbox(ctx, prefix, queue, after, count)
		return recs, "", err
	}
	n := 0
	if wait {
		n = want
	}
	read, err := r.cfg.Outbox.ReadOutboxConfirmed(ctx, prefix, queue, r.cfg.Owner, r.cfg.LeaseTTL, after, count, n, r.cfg.WaitTimeout)
	if err != nil && !errors.Is(err, taskstate.ErrWaitRefused) {
		return nil, "", err
	}
	if !read.Owned {
		// Another relay took the outbox: the next owner resumes from its
		// first record left.
		r.mu.Lock()
		delete(r.owned, queue)
		r.mu.Unlock()
		return nil, "", fmt.Errorf("outbox of queue %q: %w", queue, taskstate.ErrNotOwner)
	}
	if len(read.Records) == 0 {
		return nil, "", nil
	}
	return read.Records, r.noteWait(master, want, wait, read.Acked, err), nil
}

// planWait returns how many replicas master's batches wait for and
// whether this one does.
func (r *Relay) planWait(ctx context.Context, master, queue string) (int, bool) {
	w := &r.waits
	now := time.Now()
	w.mu.Lock()
	m := w.masters[master]
	if m == nil {
		m = &masterWait{online: -1}
		if w.masters == nil {
			w.masters = map[string]*masterWait{}
		}
		w.masters[master] = m
	}
	probe := m.behind && !now.Before(m.probeAt)
	check := probe || (r.cfg.WaitReplicas == WaitAuto && (m.checkedAt.IsZero() || now.Sub(m.checkedAt) >= autoRefresh))
	if probe {
		m.probeAt = now.Add(r.cfg.WaitProbe)
		if m.reason == unconfirmedRefused {
			m.probeAt = now.Add(refusedProbe)
		}
	}
	w.mu.Unlock()
	if check {
		r.readReplication(ctx, m, queue, now)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	want := r.cfg.WaitReplicas
	if want == WaitAuto {
		want = 0
		if m.seen {
			want = 1
		}
	}
	switch {
	case want == 0:
		return 0, false
	case !m.behind:
		return want, true
	case !probe:
		return want, false
	}
	// Probing: WAIT only when the master says enough replicas are online
	// (or cannot say); otherwise this costs one INFO per probe.
	return want, m.online < 0 || m.online >= want
}

// readReplication reads INFO replication on the master of queue into m.
func (r *Relay) readReplication(ctx context.Context, m *masterWait, queue string, now time.Time) {
	rep, err := r.cfg.Outbox.OutboxReplication(ctx, r.cfg.Names.Prefix(), queue)
	w := &r.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		m.checkedAt, m.online = now, rep.Online
		if rep.Connected > 0 {
			m.seen = true
		}
	case errors.Is(err, taskstate.ErrInfoRefused):
		if m.checkedAt.IsZero() {
			r.log.Warn("Redis refuses INFO: --redis-wait-replicas auto cannot see its replicas and waits for none; grant +info, or set --redis-wait-replicas to their number", "queue", queue, "err", err)
		}
		m.checkedAt, m.online = now, -1
	default:
		// Redis failing for a moment: the reads and publishes fail too.
		r.log.Debug("read Redis replication", "queue", queue, "err", err)
	}
}

// noteWait records what a batch of master's learned and returns its
// mark: "" when its replicas confirmed it.
func (r *Relay) noteWait(master string, want int, waited bool, acked int, waitErr error) string {
	w := &r.waits
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.masters[master]
	wasBehind := m.behind
	defer r.setBehindGauge()
	switch {
	case waitErr != nil:
		m.behind, m.reason, m.acked, m.probeAt = true, unconfirmedRefused, 0, now.Add(refusedProbe)
	case waited && acked >= want:
		m.behind, m.acked = false, acked
		if wasBehind {
			r.log.Info("Redis replicas confirm the outbox's writes again: events are published confirmed", "master", master, "replicas", acked, "unconfirmed_since", m.since)
		}
		return ""
	case waited:
		m.behind, m.reason, m.acked, m.probeAt = true, unconfirmedTimeout, acked, now.Add(r.cfg.WaitProbe)
	}
	if !wasBehind {
		m.since = now
		if waitErr != nil {
			r.log.Warn("Redis refuses WAIT: grant +wait to the replica's Redis user, or set --redis-wait-replicas 0", "master", master, "err", waitErr)
		}
	}
	reason := m.reason
	if !waited && waitErr == nil {
		reason = unconfirmedBehind
	}
	return strconv.Itoa(m.acked) + "/" + strconv.Itoa(want) + " " + reason
}

// countUnconfirmed counts n events published with mark, and warns about
// them at most once a minute: the one log line of an outage (its end is
// logged by noteWait).
func (r *Relay) countUnconfirmed(n int, mark string) {
	if n <= 0 {
		return
	}
	if m := r.cfg.Metrics; m != nil {
		m.Unconfirmed.Add(float64(n))
	}
	w := &r.waits
	w.mu.Lock()
	w.total += uint64(n)
	w.since += uint64(n)
	since := w.since
	warn := time.Since(w.logged) >= time.Minute
	if warn {
		w.logged, w.since = time.Now(), 0
	}
	w.mu.Unlock()
	if warn {
		r.log.Warn("Redis replicas did not confirm the writes of published events: they are marked unconfirmed (header "+events.HeaderRedisUnconfirmed+", counted in cronstream_relay_unconfirmed_total) until the replicas confirm again; a Redis failover now may lose their tasks, and the restore then records the loss",
			"mark", mark, "timeout", r.cfg.WaitTimeout, "unconfirmed_since_last_warning", since)
	}
}

// WaitStatus returns what the relay knows of Redis replication.
func (r *Relay) WaitStatus() WaitStatus {
	w := &r.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	st := WaitStatus{Unconfirmed: w.total}
	for _, m := range w.masters {
		want := r.cfg.WaitReplicas
		if want == WaitAuto {
			want = 0
			if m.seen {
				want = 1
			}
		}
		st.Replicas = max(st.Replicas, want)
		if m.behind && want > 0 && (!st.Behind || m.since.Before(st.Since)) {
			st.Behind, st.Since, st.Reason = true, m.since, m.reason
		}
	}
	return st
}

// setBehindGauge sets the gauge of masters behind (under w.mu).
func (r *Relay) setBehindGauge() {
	m := r.cfg.Metrics
	if m == nil {
		return
	}
	n := 0
	for _, mw := range r.waits.masters {
		if mw.behind {
			n++
		}
	}
	m.WaitBehind.Set(float64(n))
}
