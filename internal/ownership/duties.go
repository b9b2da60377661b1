package ownership

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
)

// A queue's background duties (docs/design.md "Background duties") are
// the relay of its outbox, the recoverer's pass over its tasks and the
// fail-pause scan of its archived set. They are held by the queue's owner:
// the owner of the queue's shard 0. A queue the projection names no entry
// in (asynq's own queues, which the recoverer serves) has no shards; its
// duties go with one shard of the first queue of the shard set, picked by
// a hash of its name, so they are spread over the owners too. The global
// duty (the key sweep of removed entries, whose keys span every queue and
// asynq's global history keys) goes with shard 0 of the first queue: one
// fixed shard every replica with the same projection names, held by a
// lease like any other, so it has one holder at a time and moves within
// the takeover bound like any shard.
//
// Every duty is idempotent and re-checked in Redis (the outbox lease keeps
// one publisher per outbox; the recover script re-checks each lease and
// message; a pause is conditional on the revision it saw armed; the sweep
// deletes a key only if unchanged): two replicas that both hold a duty for
// a moment, or replicas of an earlier build that run every duty
// everywhere, only repeat work.

// dutyView is the shard set's queues and the owned shards, as published
// with the owned set.
type dutyView struct {
	queues []string // sorted; nil before the first poll
	polled bool
	until  map[events.Shard]clock.Mono
}

// HoldsQueue reports whether this replica holds queue's duties now: it
// holds the lease of the queue's duty shard (DutyShard), valid by its own
// clock. Where the projection names no queue at all (no entries), every
// replica holds every queue's duties, as replicas did before ownership;
// before its first poll a replica holds none.
func (m *Manager) HoldsQueue(queue string) bool {
	v := m.duties.Load()
	if v == nil || !v.polled {
		return false
	}
	s, ok := events.DutyShard(v.queues, queue)
	return !ok || m.holds(v, s)
}

// HoldsGlobal reports whether this replica holds the global duty now
// (GlobalShard; every replica where there is no shard set).
func (m *Manager) HoldsGlobal() bool {
	v := m.duties.Load()
	if v == nil || !v.polled {
		return false
	}
	s, ok := events.GlobalShard(v.queues)
	return !ok || m.holds(v, s)
}

func (m *Manager) holds(v *dutyView, s events.Shard) bool {
	until, ok := v.until[s]
	return ok && m.clock.Mono().Before(until)
}

// publishDuties stores the duty view beside the owned set, and logs and
// exports the queues whose duties this replica gained or gave up (the
// owned set or the shard set's queues changed).
func (m *Manager) publishDuties(until map[events.Shard]clock.Mono) {
	m.duties.Store(&dutyView{queues: m.queues, polled: m.viewed, until: until})
	var queues []string
	for _, q := range m.queues {
		if _, ok := until[events.Shard{Queue: q, Index: 0}]; ok {
			queues = append(queues, q)
		}
	}
	g, _ := events.GlobalShard(m.queues)
	_, global := until[g]
	global = global && len(m.queues) > 0
	gained, lost := diffSorted(m.dutyQueues, queues)
	for _, q := range gained {
		m.m.QueueDuties.WithLabelValues(q).Set(1)
	}
	for _, q := range lost {
		m.m.QueueDuties.DeleteLabelValues(q)
	}
	if len(gained) > 0 {
		m.log.Info("queue duties taken (relay, recoverer, fail-pause scan): this replica owns the queues' shard 0", "queues", strings.Join(firstOf(gained, 16), ","), "holding", len(queues))
	}
	if len(lost) > 0 {
		m.log.Info("queue duties given up with the queues' shard 0", "queues", strings.Join(firstOf(lost, 16), ","), "holding", len(queues))
	}
	if global != m.global {
		m.global = global
		if global {
			m.m.GlobalDuty.Set(1)
			m.log.Info("global duty taken (the key sweep of removed entries): this replica owns the first queue's shard 0", "shard", g.String())
		} else {
			m.m.GlobalDuty.Set(0)
			m.log.Info("global duty given up")
		}
	}
	m.dutyQueues = queues
}

// diffSorted returns what b has that a has not, and what a has that b has
// not (both sorted).
func diffSorted(a, b []string) (added, removed []string) {
	for _, q := range b {
		if _, ok := slices.BinarySearch(a, q); !ok {
			added = append(added, q)
		}
	}
	for _, q := range a {
		if _, ok := slices.BinarySearch(b, q); !ok {
			removed = append(removed, q)
		}
	}
	return added, removed
}

// newDutyMetrics are the duty metrics of Metrics.
func newDutyMetrics() (*prometheus.GaugeVec, prometheus.Gauge) {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cronstream_queue_duties", Help: "1 for each queue whose duties this replica holds (it owns the queue's shard 0): the relay of its outbox, the recoverer's pass, the fail-pause scan of its archived set.",
		}, []string{"queue"}), prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_global_duty", Help: "1 while this replica holds the global duty (it owns the first queue's shard 0): the key sweep of removed entries.",
		})
}
