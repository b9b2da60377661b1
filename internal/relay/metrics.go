package relay

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the relay's Prometheus metrics.
type Metrics struct {
	Published     prometheus.Counter
	PublishErrors prometheus.Counter
	Backlog       prometheus.Gauge
	Forgeries     prometheus.Counter
	BacklogBytes  prometheus.Gauge
	Dropped       prometheus.Counter
	Unconfirmed   prometheus.Counter
	WaitBehind    prometheus.Gauge
	Orphans       prometheus.Counter
	Held          prometheus.Gauge
}

// NewMetrics creates the relay metrics and registers them with reg (nil:
// not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_relay_published_total", Help: "Outbox records published to the activity stream.",
		}),
		PublishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_relay_publish_errors_total", Help: "Relay passes that stopped at a failed publish.",
		}),
		Backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_relay_backlog", Help: "Outbox records waiting to be published, over every outbox.",
		}),
		Forgeries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_relay_forgeries_total", Help: "Events the stream dropped as duplicates of a different message published first under their id (a forgery).",
		}),
		BacklogBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_relay_backlog_bytes", Help: "Redis memory taken by outboxes holding records (MEMORY USAGE, sampled).",
		}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_relay_dropped_total", Help: "Outbox records, or records of a multi-record, dropped as undecodable or unroutable: their events are not in the activity stream (each is logged).",
		}),
		Unconfirmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_relay_unconfirmed_total", Help: "Events published although Redis's replicas had not confirmed their writes (WAIT timed out or refused, or the replicas were found behind); each carries the Cronstream-Redis-Unconfirmed header.",
		}),
		WaitBehind: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_relay_redis_wait_behind", Help: "Redis masters whose replicas did not confirm the outbox's last writes: their events are published marked unconfirmed.",
		}),
		Orphans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_relay_orphan_passes_total", Help: "Passes that published the outbox of a queue this replica does not own because nobody relayed it (its owner killed and not yet replaced, or cut off from NATS); each is logged.",
		}),
		Held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_relay_outboxes_held", Help: "Outboxes whose lease this replica's relay holds: it publishes their records.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Published, m.PublishErrors, m.Backlog, m.Forgeries, m.BacklogBytes, m.Dropped, m.Unconfirmed, m.WaitBehind, m.Orphans, m.Held)
	}
	return m
}
