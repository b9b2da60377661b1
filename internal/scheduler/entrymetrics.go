package scheduler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// entryTimes is one entry's last handled tick and next tick as the
// scheduler knows them; a zero time is unknown (or none, for next).
type entryTimes struct {
	id, queue  string
	last, next time.Time
}

// scrapeWait bounds how long a scrape waits for the loop to list the
// entries; a loop busy longer (a burst of fires) yields a scrape without
// per-entry series rather than a hung /metrics.
const scrapeWait = 2 * time.Second

var (
	lastFireDesc = prometheus.NewDesc("cronstream_entry_last_fire_timestamp_seconds",
		"Unix time of the entry's last handled tick (fired, or skipped by its catch-up or overlap policy); only on the replica that owns the entry's shard, only with --metrics-per-entry.",
		[]string{"entry", "queue"}, nil)
	nextFireDesc = prometheus.NewDesc("cronstream_entry_next_fire_timestamp_seconds",
		"Unix time of the entry's next tick (before jitter); absent while paused; only on the replica that owns the entry's shard, only with --metrics-per-entry.",
		[]string{"entry", "queue"}, nil)
	stalenessDesc = prometheus.NewDesc("cronstream_config_staleness_seconds",
		"Seconds since the projection last heard the config stream (a message or a heartbeat; lags by up to about four heartbeats on an idle stream). Absent until first heard.",
		nil, nil)
	capacityDesc = prometheus.NewDesc("cronstream_fire_capacity",
		"Fires per second this replica has shown it can fire: the best, over 10 s windows of the last hour with at least 100 fires, of the lesser of its fires per second of fire-pass time and its fires per second of the CPU it may use (all the process's CPU counted). Absent while it has shown nothing (unknown).",
		nil, nil)
)

// Collector returns the scheduler's scrape-time metrics: config staleness,
// the capacity this replica has shown (Capacity), and with perEntry the last and next fire time of each entry of the shards
// this replica owns, so each entry's series is on one replica only and
// moves with its shard. The per-entry series are listed by the loop at
// scrape time (one pass over the entries), never updated per fire.
func (s *Scheduler) Collector(perEntry bool) prometheus.Collector {
	return &collector{s: s, perEntry: perEntry}
}

type collector struct {
	s        *Scheduler
	perEntry bool
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- stalenessDesc
	ch <- capacityDesc
	if c.perEntry {
		ch <- lastFireDesc
		ch <- nextFireDesc
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	if heard := s.cfg.Projection.LastHeard(); !heard.IsZero() {
		ch <- prometheus.MustNewConstMetric(stalenessDesc, prometheus.GaugeValue, max(s.clock.Now().Sub(heard), 0).Seconds())
	}
	if c, ok := s.Capacity(); ok {
		ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, c.PerSecond)
	}
	if !c.perEntry {
		return
	}
	for _, e := range s.ownedEntryTimes() {
		if !e.last.IsZero() {
			ch <- prometheus.MustNewConstMetric(lastFireDesc, prometheus.GaugeValue, unixSeconds(e.last), e.id, e.queue)
		}
		if !e.next.IsZero() {
			ch <- prometheus.MustNewConstMetric(nextFireDesc, prometheus.GaugeValue, unixSeconds(e.next), e.id, e.queue)
		}
	}
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// ownedEntryTimes asks the loop for the entries of the shards this
// replica owns; nil when the loop does not answer within scrapeWait (busy,
// or not running).
func (s *Scheduler) ownedEntryTimes() []entryTimes {
	reply := make(chan []entryTimes, 1) // the loop never blocks on a scrape that gave up
	t := time.NewTimer(scrapeWait)
	defer t.Stop()
	select {
	case s.timesReq <- reply:
	case <-t.C:
		return nil
	}
	select {
	case out := <-reply:
		return out
	case <-t.C:
		return nil
	}
}

// listEntryTimes runs on the loop: the entries of the shards this replica
// owns, paused ones included.
func (s *Scheduler) listEntryTimes() []entryTimes {
	out := make([]entryTimes, 0, len(s.entries))
	for id, r := range s.entries {
		if r.state.removed() {
			continue
		}
		e := entryTimes{id: id, queue: r.queue}
		if r.state == stateReady && r.hasCursor {
			e.last = r.cursor
		}
		if !r.st.Entry.Paused && r.sched != nil && r.state == stateReady {
			e.next = r.next()
		}
		out = append(out, e)
	}
	return out
}
