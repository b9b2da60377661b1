package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// sentFire is what apply needs to know of a fire once it was sent.
type sentFire struct {
	kind    taskstate.FireKind
	tick    time.Time
	carried skipKinds // the skipped records it carried
	// res is the fire's result, nil when that was taskstate.FiredPending
	// of taskID and tick: a pass keeps its fires' results until all are
	// back, and a burst's are nearly all that one, so it keeps the task id
	// instead of a whole result per fire.
	res    *taskstate.FireResult
	taskID string
}

// sentOf is what applying res, f's result, needs of both.
func sentOf(f *taskstate.Fire, res *taskstate.FireResult) sentFire {
	sent := sentFire{kind: f.Kind, tick: f.Tick, carried: skipReasons(f.SkippedRecords)}
	if res.Err == nil && res.Status == taskstate.StatusFired && *res == taskstate.FiredPending(res.TaskID, f.Tick) {
		sent.taskID = res.TaskID
		return sent
	}
	kept := *res
	sent.res = &kept
	return sent
}

// result is the fire's result.
func (f *sentFire) result() taskstate.FireResult {
	if f.res != nil {
		return *f.res
	}
	return taskstate.FiredPending(f.taskID, f.tick)
}

// apply acts on one fire's result, applied at now (read once for a whole
// pass), and returns the asynq history record of a created task.
func (s *Scheduler) apply(r *entryRun, f sentFire, res taskstate.FireResult, now time.Time) (taskstate.EnqueueEventRecord, bool) {
	s.outcome(schedule.Outcome{Entry: r.id, Tick: f.tick, Status: fireStatus(res.Status), Err: res.Err,
		Missed: res.Err == nil && !res.Status.Refused() && f.carried.missed})
	switch {
	case res.Err != nil:
		s.countError()
		r.tries++
		s.log.Warn("fire failed; will retry", "entry", r.id, "tick", f.tick, "err", res.Err)
	case res.Status == taskstate.StatusCompleted:
		s.reachedLimit(r, res)
	case res.Status.Refused():
		s.refused(r, f, res)
	default:
		return s.committed(r, f, res, now)
	}
	return taskstate.EnqueueEventRecord{}, false
}

// reachedLimit follows a fire refused because r's limit is reached: not a
// fault, the entry fires no more.
func (s *Scheduler) reachedLimit(r *entryRun, res taskstate.FireResult) {
	s.complete(r)
	s.m.Completed.Inc()
	if res.Fires >= taskstate.FireCountUnknown {
		s.log.Info("entry's max fires count is unknown (Redis lost it); firing nothing more until its max_fires changes", "entry", r.id, "max_fires", r.st.Entry.MaxFires)
	} else {
		s.log.Info("entry completed its max fires; firing nothing more", "entry", r.id, "max_fires", r.st.Entry.MaxFires, "fired", res.Fires)
	}
}

// refused follows a fire of r Redis refused (res.Status.Refused()).
func (s *Scheduler) refused(r *entryRun, f sentFire, res taskstate.FireResult) {
	s.countRefused(res.Status.String())
	switch res.Status {
	case taskstate.StatusWatermarkMismatch:
		if r.hasHandled && (!res.HasWatermark || res.Watermark.Before(r.handled)) {
			// The watermark vanished under us, or went back before a tick
			// it held (Redis lost data, a lagging replica was promoted):
			// load it again, which re-seeds it from the later of r.handled
			// and the stream, instead of firing those ticks again.
			r.tries++
			s.reload(r)
			return
		}
		r.cursor, r.hasCursor, r.lastTask = res.Watermark, res.HasWatermark, res.WatermarkTaskID
		r.handled, r.hasHandled = res.Watermark, res.HasWatermark
		s.clearFenced()
		if res.HasWatermark && !res.Watermark.Before(f.tick) {
			r.tries = 0 // someone else handled it: nothing wrong
		} else {
			r.tries++
		}
	case taskstate.StatusMoved:
		r.tries++
		if r.st.Revision > res.MovedAt {
			// Our configuration, newer than the move, says the entry lives
			// here again (it moved away and back while this replica did
			// not follow live): close the queues it used since and reopen
			// this one.
			r.loading.reopen = true
			s.reload(r)
		} else {
			s.suspectEpoch(r.queue, r.id, res.MovedAt, "")
		}
	case taskstate.StatusRevisionFenced:
		r.tries++
		s.noteFenced(res.Fence)
		s.suspectEpoch(r.queue, "", res.Fence, res.FenceID)
	default: // stale: our view of the config is behind
		r.tries++
		s.noteFenced(0)
	}
}

// committed follows a fire of r that Redis committed: its watermark moved
// (a tick or a skip), and the skipped ticks it carried are counted.
func (s *Scheduler) committed(r *entryRun, f sentFire, res taskstate.FireResult, now time.Time) (taskstate.EnqueueEventRecord, bool) {
	r.tries = 0
	s.clearFenced()
	if f.kind == taskstate.FireTick || f.kind == taskstate.FireSkip {
		r.cursor, r.hasCursor = f.tick, true
		r.handled, r.hasHandled = f.tick, true
	}
	s.countCarried(r, f, now)
	switch res.Status {
	case taskstate.StatusFired:
		if res.Replaced != "" {
			s.replacedWaiting(r, f.tick, res)
		}
		r.lastTask = res.TaskID
		s.m.Fired.WithLabelValues(r.queue).Inc()
		s.m.FireLag.Observe(now.Sub(f.tick).Seconds())
		trim := r.recorded%historyTrimEvery == 0
		r.recorded++
		return taskstate.EnqueueEventRecord{Entry: r.id, Event: taskstate.SchedulerEnqueueEvent{TaskID: res.TaskID, EnqueueTime: now}, Trim: trim}, true
	case taskstate.StatusSkippedOverlap:
		s.m.Skipped.WithLabelValues(events.SkipOverlap).Inc()
	case taskstate.StatusHeld:
		s.held.holding = true
		s.log.Debug("tick held: the previous task is busy", "entry", r.id, "tick", f.tick, "task", res.TaskID)
		if res.Replaced != "" {
			s.held.cancels = append(s.held.cancels, heldCancel{queue: r.queue, entry: r.id, task: res.Replaced})
		}
	case taskstate.StatusDuplicate:
		s.m.Skipped.WithLabelValues(events.SkipUnique).Inc()
	}
	// StatusAlreadyExists: created before, by this tick's earlier attempt
	// or a backfill: nothing new.
	return taskstate.EnqueueEventRecord{}, false
}

// countCarried counts the skipped records a committed fire of r carried.
func (s *Scheduler) countCarried(r *entryRun, f sentFire, now time.Time) {
	if f.carried.missed {
		r.skippedAt = now
		s.m.Skipped.WithLabelValues(events.SkipMissed).Inc()
		s.missed.add(r.id, f.tick)
	}
	if f.carried.excluded {
		s.m.Skipped.WithLabelValues(events.SkipExcluded).Inc()
	}
	if f.carried.paused {
		s.m.Skipped.WithLabelValues(events.SkipPaused).Inc()
		s.log.Info("ticks due before the entry was paused, which no replica had fired, recorded as skipped (reason paused)", "entry", r.id, "until", f.tick)
	}
	if f.carried.removed {
		s.m.Skipped.WithLabelValues(events.SkipRemoved).Inc()
		s.log.Info("ticks due before the entry was removed, which no replica had fired, recorded as skipped (reason removed)", "entry", r.id, "until", f.tick)
	}
}

// missedTally gathers the entries whose missed ticks (older than the
// catch-up grace) the fire passes recorded as skipped, so the log says so
// in one line, at most every missedReportEvery: the skipped events tell
// which ticks; the line tells an operator reading the log that this
// replica came to them too late (an overload would otherwise log a line
// per pass).
type missedTally struct {
	entries int
	first   string
	// until is the earliest tick fired after the missed ones.
	until time.Time
	// said is when the last line was logged.
	said clock.Mono
}

const missedReportEvery = 10 * time.Second

func (m *missedTally) add(entry string, tick time.Time) {
	if m.entries == 0 || tick.Before(m.until) {
		m.first, m.until = entry, tick
	}
	m.entries++
}

// report logs what the passes recorded as missed since the last line.
func (m *missedTally) report(s *Scheduler) {
	if m.entries == 0 || (!m.said.IsZero() && s.clock.Since(m.said) < missedReportEvery) {
		return
	}
	s.log.Warn("ticks older than the catch-up grace recorded as skipped (missed): this replica came to them too late",
		"entries", m.entries, "first", m.first, "until", m.until.UTC(), "grace", s.cfg.Grace)
	*m = missedTally{said: s.clock.Mono()}
}
