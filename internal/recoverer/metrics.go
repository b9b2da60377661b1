package recoverer

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the recoverer's Prometheus metrics, per queue.
type Metrics struct {
	Recovered    *prometheus.CounterVec   // queue, outcome (retried, archived, skipped)
	Orphans      *prometheus.CounterVec   // queue, action (leased, removed)
	Reclaimed    *prometheus.CounterVec   // queue
	Bad          *prometheus.CounterVec   // queue
	Errors       *prometheus.CounterVec   // queue ("" for listing queues)
	PassDuration *prometheus.HistogramVec // queue
	Searched     *prometheus.CounterVec   // queue
	// Queues is how many queues this replica recovers (it holds their
	// duties).
	Queues prometheus.Gauge
}

// NewMetrics creates the recoverer metrics and registers them with reg (nil:
// not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_recovered_total", Help: "Lease-expired tasks, by outcome: retried, archived, or skipped (lease extended, message changed, gone).",
		}, []string{"queue", "outcome"}),
		Orphans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_orphans_total", Help: "Active tasks without a lease entry: leased (given one) or removed (stray id).",
		}, []string{"queue", "action"}),
		Reclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_aggregation_sets_reclaimed_total", Help: "Stale aggregation sets returned to their group.",
		}, []string{"queue"}),
		Bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_recover_bad_tasks_total", Help: "Lease-expired tasks that cannot be recovered (missing or undecodable message), each counted once.",
		}, []string{"queue"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_recover_errors_total", Help: "Recovery passes of a queue that failed.",
		}, []string{"queue"}),
		PassDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cronstream_recover_pass_seconds", Help: "Duration of one recovery pass over a queue.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"queue"}),
		Searched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_recover_searched_total", Help: "Lease-expired tasks the move script had to search asynq's active list for (LPOS, a scan of the list) because the position read before the move was stale: each costs a scan, and a pass slows as this grows.",
		}, []string{"queue"}),
		Queues: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_recover_queues", Help: "Queues this replica's recoverer serves: with shard ownership, those whose duties it holds (it owns the queue's shard 0).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Recovered, m.Orphans, m.Reclaimed, m.Bad, m.Errors, m.PassDuration, m.Searched, m.Queues)
	}
	return m
}

// initQueue creates queue q's series at 0, so they exist before its first
// recovery or error: rate() and increase() see that first one.
func (m *Metrics) initQueue(q string) {
	for _, outcome := range []string{"retried", "archived", "skipped"} {
		m.Recovered.WithLabelValues(q, outcome)
	}
	for _, action := range []string{"leased", "removed"} {
		m.Orphans.WithLabelValues(q, action)
	}
	m.Reclaimed.WithLabelValues(q)
	m.Bad.WithLabelValues(q)
	m.Errors.WithLabelValues(q)
	m.Searched.WithLabelValues(q)
}
