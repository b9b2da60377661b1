package ownership

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/shardview"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Report is what a replica owns and sees of the shard leases
// (shardview.Report: its heartbeat carries it, for status).
type Report = shardview.Report

// Report returns the last poll's report.
func (m *Manager) Report() Report { return *m.report.Load() }

// Ready returns why this replica should not be ready, or nil: shards it
// should own have had no owner for longer than UnownedReadyAfter (it
// cannot take them: Redis refuses, or it is cut off from NATS), or it
// could not read the leases for that long.
func (m *Manager) Ready() error {
	r := m.report.Load()
	w := &m.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	bound := m.cfg.UnownedReadyAfter
	if !w.unownedSince.IsZero() && m.clock.Since(w.unownedSince) > bound {
		return fmt.Errorf("shards this replica should own have had no owner for %s (%s): %s",
			m.clock.Since(w.unownedSince).Round(time.Second), strings.Join(r.Unowned, " "), r.Problem)
	}
	if !w.readFail.IsZero() && m.clock.Since(w.readFail) > bound {
		return fmt.Errorf("cannot read the shard leases for %s: %s", m.clock.Since(w.readFail).Round(time.Second), w.readErr)
	}
	return nil
}

// observe computes the lease freshness every replica reports (shards
// without an owner beyond a takeover's time, leases of replicas that are
// not live members, the oldest renewal), its metrics, log lines and
// report.
func (m *Manager) observe(now clock.Mono, v taskstate.ShardLeaseView, leases map[events.Shard]taskstate.ShardLease) {
	bound := time.Duration(max(len(m.cands), 1))*m.cfg.TakeoverStep + m.cfg.LeasePoll
	var unowned, mineUnowned []events.Shard
	for _, s := range m.shards {
		if at, free := m.free[s]; free && m.clock.Since(at) > bound {
			unowned = append(unowned, s)
			if m.assign.desired[s] == m.cfg.ReplicaID {
				mineUnowned = append(mineUnowned, s)
			}
		}
	}
	live := m.cfg.Members.Live()
	notLive := map[string]int{}
	oldest := time.Duration(0)
	for _, l := range v.Leases {
		if _, ok := slices.BinarySearch(live, l.Holder); !ok {
			notLive[l.Holder]++
		}
		oldest = max(oldest, v.Now.Sub(l.Renewed))
	}
	// The last holder seen of each shard, kept while it is free: whether
	// a shard taken was handed over or taken over depends on it.
	for s, l := range leases {
		m.last[s] = l
	}
	m.m.Unowned.Set(float64(len(unowned)))
	m.m.NotLive.Set(float64(sum(notLive)))
	m.m.OldestRenewal.Set(oldest.Seconds())
	m.watch.freshness(m, unowned, mineUnowned, notLive)
	r := &Report{Shards: len(m.shards), Owned: m.validCount(), Desired: m.assign.mine, UnownedCount: len(unowned), NotLive: sum(notLive),
		OldestRenewal: oldest.Seconds(), Problem: m.watch.problem(),
		HandoversIn: m.handedIn.Load(), HandoversOut: m.handedOut.Load(), Takeovers: m.tookOver.Load()}
	for _, s := range firstOf(unowned, 8) {
		r.Unowned = append(r.Unowned, s.String())
	}
	m.report.Store(r)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// readFailed and readOK follow whether the leases can be read.
func (m *Manager) readFailed(now clock.Mono, err error) {
	m.m.Errors.Inc()
	w := &m.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.readFail.IsZero() {
		w.readFail = now
		m.log.Warn("cannot read the shard leases; the owned shards fire until their leases' term, none is taken", "err", err)
	}
	w.readErr = err.Error()
}

func (m *Manager) readOK() {
	w := &m.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.readFail.IsZero() {
		m.log.Info("shard leases readable again")
	}
	w.readFail, w.readErr = clock.Mono{}, ""
}

// Metrics are the ownership's Prometheus metrics.
type Metrics struct {
	Owned         prometheus.Gauge
	Desired       prometheus.Gauge
	Unowned       prometheus.Gauge
	NotLive       prometheus.Gauge
	OldestRenewal prometheus.Gauge
	Handovers     *prometheus.CounterVec
	Takeovers     prometheus.Counter
	Lost          prometheus.Counter
	Errors        prometheus.Counter
	// QueueDuties and GlobalDuty say which duties this replica holds
	// (duties.go).
	QueueDuties *prometheus.GaugeVec
	GlobalDuty  prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_shards_owned", Help: "Shards whose lease this replica holds: it fires their entries.",
		}),
		Desired: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_shards_desired", Help: "Shards this replica should own by its view of the membership.",
		}),
		Unowned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_shards_unowned", Help: "Shards without a lease for longer than a takeover takes, as this replica sees them: nobody fires their entries.",
		}),
		NotLive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_shard_leases_not_live", Help: "Shard leases held by replicas that are not live members (cut off from NATS, or of another deployment on the same Redis and prefix).",
		}),
		OldestRenewal: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_shard_lease_age_seconds", Help: "Age of the least recently renewed shard lease (a stuck owner's lease ages up to the lease term).",
		}),
		Handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_shard_handovers_total", Help: "Shards handed over between live replicas after a membership change: in (taken from a replica that released it) and out (released to its desired owner).",
		}, []string{"direction"}),
		Takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_shard_takeovers_total", Help: "Shards this replica took after their owner's lease lapsed (the owner died, froze or was cut off).",
		}),
		Lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_shard_leases_lost_total", Help: "Shard leases this replica did not renew in time and another replica took.",
		}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_shard_lease_errors_total", Help: "Shard lease reads and writes that failed.",
		}),
	}
	m.QueueDuties, m.GlobalDuty = newDutyMetrics()
	for _, d := range []string{"in", "out"} {
		m.Handovers.WithLabelValues(d)
	}
	if reg != nil {
		reg.MustRegister(m.Owned, m.Desired, m.Unowned, m.NotLive, m.OldestRenewal, m.Handovers, m.Takeovers, m.Lost, m.Errors, m.QueueDuties, m.GlobalDuty)
	}
	return m
}
