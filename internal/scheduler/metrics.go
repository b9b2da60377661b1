package scheduler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Metrics are the scheduler's Prometheus metrics.
type Metrics struct {
	Fired        *prometheus.CounterVec // by queue
	Skipped      *prometheus.CounterVec // by reason
	Refused      *prometheus.CounterVec // by status
	Errors       prometheus.Counter
	FireLag      prometheus.Histogram
	Entries      prometheus.Gauge
	Backpressure prometheus.Gauge
	Restored     *prometheus.CounterVec // by source of the seed
	Restoring    prometheus.Gauge
	// Loading counts the entries whose watermark is still to be read
	// before they fire (after a start, a shard taken, a queue change).
	Loading     prometheus.Gauge
	Implausible prometheus.Counter
	Epochs      prometheus.Counter
	Cancels     *prometheus.CounterVec // by action: cancelSent, cancelDeleted
	Completed   prometheus.Counter
	// FireCountUnknown counts limited entries made completed because
	// their fires could not be counted after Redis lost data.
	FireCountUnknown prometheus.Counter
	HeldDropped      *prometheus.CounterVec // by reason
	// HeldReleased counts the held ticks this replica fired once their
	// previous task left the busy states (they count in Fired too).
	HeldReleased prometheus.Counter
	// LostFires counts the ticks this replica's restores recorded as
	// lost (cronstream.task.lost); LostUnknown the restores that could not
	// tell which were.
	LostFires   prometheus.Counter
	LostUnknown prometheus.Counter
	// Unchecked counts the entries loaded on the watermark Redis holds
	// without the check against the activity stream, which could not be
	// read, or not in time (checkDeadline).
	Unchecked prometheus.Counter
}

// Actions of overlap cancel-previous (Metrics.Cancels).
const (
	cancelSent    = "cancel-sent"
	cancelDeleted = "deleted"
)

// NewMetrics creates the scheduler metrics and registers them with reg (nil:
// not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Fired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_fires_total", Help: "Ticks this replica enqueued as asynq tasks.",
		}, []string{"queue"}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_skipped_total", Help: "Ticks this replica recorded as skipped, by reason (missed counts skip events, which may cover many ticks).",
		}, []string{"reason"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_fire_refused_total", Help: "Fire attempts Redis refused, by reason (watermark-mismatch is normal when another replica fired first).",
		}, []string{"status"}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_fire_errors_total", Help: "Fire attempts that failed (Redis unreachable, script error).",
		}),
		FireLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cronstream_fire_lag_seconds", Help: "From a tick's scheduled time to its task being in Redis.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10, 30, 60},
		}),
		Entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_scheduler_entries", Help: "Entries of the shards this replica owns (paused included): the entries it schedules.",
		}),
		Backpressure: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_scheduler_backpressure", Help: "1 while firing is paused because the outbox backlog is over its bound.",
		}),
		Restored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_watermarks_restored_total", Help: "Watermarks found missing or older than a handled tick (Redis lost data) and restored, by where the seed came from (cursor: this replica's position, replica: another running replica's, stream: the activity stream).",
		}, []string{"from"}),
		Restoring: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_watermarks_restoring", Help: "Entries whose fires this replica holds while their watermark, lost in Redis, is restored (the restore proposal settling, or the activity stream unreadable with no replica's position to restore from).",
		}),
		Loading: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cronstream_watermarks_loading", Help: "Entries of the shards this replica owns that do not fire yet because their watermark is still to be read (after a start, a shard taken over, a queue change).",
		}),
		Implausible: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_scheduler_implausible_observations_total", Help: "Fires read back from the activity stream (to check or restore a watermark) for a tick far ahead of the clock (forged, or a publisher's wrong clock); ignored.",
		}),
		Epochs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_stream_epochs_total", Help: "Revision fences and handover markers holding a sequence of an earlier config stream (recreated or restored) that this replica cleared.",
		}),
		Cancels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_overlap_cancels_total", Help: "Overlap cancel-previous: cancellations of running previous tasks this replica published (cancel-sent), and replaced tasks it deleted (deleted: waiting ones, and cancelled ones back in retry).",
		}, []string{"action"}),
		Completed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_max_fires_reached_total", Help: "Ticks refused because their entry already fired its max_fires (the entry is completed and fires nothing more until its limit changes).",
		}),
		Unchecked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_watermarks_unchecked_total", Help: "Entries loaded (after a takeover, a handover or a start, with a tick due) on the watermark Redis holds without checking it against the activity stream's last fire, because the stream could not be read (NATS unreachable, or no answer within the read's bound, or none before the entry's first due tick would have aged past the grace): a Redis rollback while no replica ran would go unseen for them.",
		}),
		FireCountUnknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_max_fires_unknown_total", Help: "Limited entries whose max_fires count Redis lost and the activity stream could no longer rebuild (events past its retention): made completed, firing nothing until max_fires is set to another value.",
		}),
		HeldDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_held_dropped_total", Help: "Ticks held by overlap buffer-one or cancel-previous that this replica dropped instead of firing, by reason (paused, removed, moved, policy: no longer holds ticks, existed: the task was there already, completed: max_fires reached).",
		}, []string{"reason"}),
		HeldReleased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_held_released_total", Help: "Ticks held by overlap buffer-one or cancel-previous that this replica fired once their previous task left the busy states (counted in cronstream_fires_total too).",
		}),
		LostFires: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_fires_lost_total", Help: "Fires the activity stream records whose tasks Redis lost (a failover to a lagging replica, a flush), found by this replica's restores of their watermarks and recorded as cronstream.task.lost.",
		}),
		LostUnknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_fires_lost_unknown_total", Help: "Restores of a watermark Redis lost where which fires lost their tasks could not be told (no watermark left, or the activity stream unreadable), recorded as cronstream.task.lost with unknown set.",
		}),
	}
	// Every known label value starts at 0, so the series exist before the
	// first refusal or skip: rate() and increase() see that first one, and
	// the alert rules in deploy/ find the metrics on a fresh replica.
	for s := taskstate.StatusWatermarkMismatch; s <= taskstate.StatusStale; s++ {
		m.Refused.WithLabelValues(s.String())
	}
	m.Cancels.WithLabelValues(cancelSent)
	m.Cancels.WithLabelValues(cancelDeleted)
	for _, reason := range []string{events.SkipMissed, events.SkipOverlap, events.SkipUnique, events.SkipExcluded, events.SkipPaused, events.SkipRemoved, events.SkipOverlapDropped} {
		m.Skipped.WithLabelValues(reason)
	}
	for _, reason := range heldDropReasons {
		m.HeldDropped.WithLabelValues(reason)
	}
	if reg != nil {
		reg.MustRegister(m.Fired, m.Skipped, m.Refused, m.Errors, m.FireLag, m.Entries, m.Backpressure, m.Restored, m.Restoring, m.Loading, m.Implausible, m.Epochs, m.Cancels, m.Completed, m.FireCountUnknown, m.HeldDropped, m.HeldReleased, m.LostFires, m.LostUnknown, m.Unchecked)
	}
	return m
}

// setEntriesGauge sets the gauges of the entries this replica schedules.
func (s *Scheduler) setEntriesGauge() {
	s.m.Entries.Set(float64(len(s.entries) - s.removedRuns))
	s.m.Loading.Set(float64(len(s.loading)))
	s.m.Restoring.Set(float64(s.restoringEntries()))
}

func (s *Scheduler) countError() { s.m.Errors.Inc() }

func (s *Scheduler) countRefused(status string) { s.m.Refused.WithLabelValues(status).Inc() }

// HeapOps counts the operations on the heap of due entries (pushes, moves,
// removals, pops): work proportional to this replica's share of the
// entries, which simulations compare across replicas.
func (s *Scheduler) HeapOps() uint64 { return s.heap.ops.Load() }

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
