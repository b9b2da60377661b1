package scheduler_test

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
)

// counts is what a test reads of one scheduler's Prometheus metrics: the
// metrics are the scheduler's only counters.
type counts struct {
	Fired, SkippedMissed, SkippedOverlap, SkippedExcluded uint64
	SkippedPaused, SkippedRemoved                         uint64
	Completed, FireCountUnknown                           uint64
	Refused                                               map[string]uint64 // by status
	Errors, Implausible, Epochs                           uint64
	Released, DroppedHeld                                 uint64
	CancelsSent, CancelDeleted                            uint64
	LostFires, LostUnknown, Unchecked                     uint64
	Entries, Loading, Restoring                           int
}

// readCounts reads m.
func readCounts(m *scheduler.Metrics) counts {
	n := func(c prometheus.Collector) uint64 { return uint64(valuesOf(c)[""]) }
	gauge := func(g prometheus.Gauge) int { return int(valuesOf(g)[""]) }
	return counts{
		Fired:            n(m.Fired),
		SkippedMissed:    n(m.Skipped.WithLabelValues(events.SkipMissed)),
		SkippedOverlap:   n(m.Skipped.WithLabelValues(events.SkipOverlap)),
		SkippedExcluded:  n(m.Skipped.WithLabelValues(events.SkipExcluded)),
		SkippedPaused:    n(m.Skipped.WithLabelValues(events.SkipPaused)),
		SkippedRemoved:   n(m.Skipped.WithLabelValues(events.SkipRemoved)),
		Completed:        n(m.Completed),
		FireCountUnknown: n(m.FireCountUnknown),
		Refused:          byLabel(m.Refused),
		Errors:           n(m.Errors),
		Implausible:      n(m.Implausible),
		Epochs:           n(m.Epochs),
		Released:         n(m.HeldReleased),
		DroppedHeld:      n(m.HeldDropped),
		CancelsSent:      n(m.Cancels.WithLabelValues("cancel-sent")),
		CancelDeleted:    n(m.Cancels.WithLabelValues("deleted")),
		LostFires:        n(m.LostFires),
		LostUnknown:      n(m.LostUnknown),
		Unchecked:        n(m.Unchecked),
		Entries:          gauge(m.Entries),
		Loading:          gauge(m.Loading),
		Restoring:        gauge(m.Restoring),
	}
}

// valuesOf is the value of each series of c's one label (a counter or
// gauge, a vector or not), and their sum under "".
func valuesOf(c prometheus.Collector) map[string]float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		panic(err) // a lone counter or gauge always gathers
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			val := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			if l := m.GetLabel(); len(l) == 1 {
				out[l[0].GetValue()] += val
			}
			out[""] += val
		}
	}
	return out
}

// byLabel is a counter vector's value per value of its label.
func byLabel(v *prometheus.CounterVec) map[string]uint64 {
	out := map[string]uint64{}
	for k, val := range valuesOf(v) {
		if k != "" {
			out[k] = uint64(val)
		}
	}
	return out
}

// counts reads the node's scheduler metrics.
func (n *node) counts() counts { return readCounts(n.metrics) }
