package scheduler

import (
	"bytes"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// planExcluded records the run of excluded ticks that starts at r's due
// tick next, up to now, as one skipped event with reason excluded, moving
// the watermark to the last of them without creating a task: the same
// atomic step as a missed-tick skip, so an excluded tick is handled once
// whichever replica gets there. more is true when the run was cut at
// maxCount and continues.
func (s *Scheduler) planExcluded(r *entryRun, next, now time.Time, into []taskstate.Fire) ([]taskstate.Fire, bool) {
	rng := tickRange{First: next, Last: next, Count: 1, Exact: true}
	more := false
	for t := r.sched.Next(next); !t.IsZero() && !t.After(now) && r.sched.Excluded(t); t = r.sched.Next(t) {
		if rng.Count == maxCount {
			more = true
			break
		}
		rng.Last = t
		rng.Count++
	}
	f, err := s.excludedFire(r, rng, r.cursor, r.hasCursor, now)
	if err != nil {
		s.countError()
		s.log.Error("cannot build skipped record", "entry", r.id, "err", err)
		return nil, false
	}
	return append(into, f), more
}

// excludedFire is the skip step of a run of excluded ticks, expecting the
// watermark at expected (hasExpected false: none).
func (s *Scheduler) excludedFire(r *entryRun, rng tickRange, expected time.Time, hasExpected bool, now time.Time) (taskstate.Fire, error) {
	rec, err := s.skippedRecord(r, rng, events.SkipExcluded, now)
	if err != nil {
		return taskstate.Fire{}, err
	}
	return taskstate.NewSkipFire(s.cfg.Names.Prefix(), r.queue, r.id, rng.Last, expected, hasExpected,
		[]taskstate.Record{rec}), nil
}

// excludedReason, pausedReason and removedReason are how skippedRecord's
// JSON writes those reasons.
var (
	excludedReason = []byte(`"reason":"` + events.SkipExcluded + `"`)
	pausedReason   = []byte(`"reason":"` + events.SkipPaused + `"`)
	removedReason  = []byte(`"reason":"` + events.SkipRemoved + `"`)
)

// skipKinds says which kinds of skipped records a fire carries.
type skipKinds struct {
	missed, excluded, paused, removed bool
}

// skipReasons reads the kinds of skipped records recs holds, for the
// counters: the records are already-encoded events, and the scheduler
// writes those reasons exactly as excludedReason, pausedReason and
// removedReason hold them.
func skipReasons(recs []taskstate.Record) skipKinds {
	var k skipKinds
	for _, rec := range recs {
		switch {
		case bytes.Contains(rec.Data, excludedReason):
			k.excluded = true
		case bytes.Contains(rec.Data, pausedReason):
			k.paused = true
		case bytes.Contains(rec.Data, removedReason):
			k.removed = true
		default:
			k.missed = true
		}
	}
	return k
}
