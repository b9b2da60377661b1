package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// plan turns r's due tick, and any missed ticks before it, into fires,
// appended to into (a scratch slice the caller reuses).
//
// The fired records' data of the fires it returns is only valid until the
// next plan (firedRecord): sendPass copies it into the batch the fires go in.
func (s *Scheduler) plan(r *entryRun, now time.Time, into []taskstate.Fire) ([]taskstate.Fire, bool) {
	s.firedData = s.firedData[:0]
	if r.settling() {
		rng := r.settleTicks()
		fires, _ := s.planSkip(r, rng, r.settle.reason, now, into)
		return fires, !rng.Exact
	}
	if r.state.removed() || r.st.Entry.Paused {
		return nil, false
	}
	start := r.start()
	next := r.next()
	if next.IsZero() || next.Add(r.sched.Jitter(next)).After(now) {
		return nil, false
	}
	if r.sched.Excluded(next) {
		return s.planExcluded(r, next, now, into)
	}
	// Only ticks older than grace are missed; a younger tick is fired
	// normally.
	grace := s.grace(r)
	var one [1]time.Time
	var ticks []time.Time
	var skipped tickRange
	more := false
	if next.Before(now.Add(-grace)) {
		p := planCatchup(r.sched, r.st.Entry.Catchup, start, now, grace, s.cfg.MaxCatchup)
		skipped = p.Skipped
		ticks, more = p.Fire, p.More
		if len(ticks) == 0 {
			// No missed tick to fire. The tick right after them is within
			// the grace: when it is due already, it fires in the same step
			// that records the missed ones. A step of its own would leave
			// the entry a grace behind, and a replica whose pass takes
			// longer than the rest of the grace (overloaded) would find it
			// missed again and record skips pass after pass, firing
			// nothing.
			if tick, run, ok := s.dueAfterSkip(r, start, skipped, now, grace); ok {
				one[0], skipped = tick, run
				ticks = one[:]
			} else {
				// Nothing due now: record the missed ticks at once, in a
				// step of their own under the same compare-and-set.
				return s.planSkip(r, skipped, events.SkipMissed, now, into)
			}
		}
	} else {
		one[0] = next
		ticks = one[:]
	}
	fires := into
	expected, hasExpected := r.cursor, r.hasCursor
	for i, tick := range ticks {
		var f taskstate.Fire
		var err error
		if r.sched.Excluded(tick) {
			f, err = s.excludedFire(r, tickRange{First: tick, Last: tick, Count: 1, Exact: true}, expected, hasExpected, now)
		} else {
			f, err = s.buildFire(r, tick, expected, hasExpected, now)
		}
		if err != nil {
			s.countError()
			s.log.Error("cannot build fire", "entry", r.id, "tick", tick, "err", err)
			return nil, false
		}
		if i == 0 && !skipped.empty() {
			rec, err := s.skippedRecord(r, skipped, events.SkipMissed, now)
			if err == nil {
				f.SkippedRecords = append(f.SkippedRecords, rec)
			}
		}
		fires = append(fires, f)
		expected, hasExpected = tick, true
	}
	return fires, more
}

// dueAfterSkip is the tick of r that fires in the step recording the
// missed ticks skipped, and the run of ticks that step records: the first
// tick after the missed ones, when it is due at now (its jitter included)
// and not excluded.
//
// An entry found with missed ticks again within two graces of a committed
// step that recorded missed ones is one this replica does not keep up
// with (more due than it fires in a grace): firing its oldest tick within
// the grace would keep it a grace behind, found missed again at every
// pass, a skipped record with every fire, which the relay and the stream
// pay for too. It fires its latest due tick instead, the ticks before it
// recorded in the same skipped run, and is back on time. Ticks within the
// grace are skipped only then: after an outage or a restore the first
// step fires the oldest of them, and a replica that keeps up fires the
// rest before they age out.
func (s *Scheduler) dueAfterSkip(r *entryRun, start time.Time, skipped tickRange, now time.Time, grace time.Duration) (time.Time, tickRange, bool) {
	if skipped.empty() || !skipped.Exact {
		return time.Time{}, tickRange{}, false
	}
	due := func(t time.Time) bool {
		return !t.IsZero() && !t.Add(r.sched.Jitter(t)).After(now) && !r.sched.Excluded(t)
	}
	if !r.skippedAt.IsZero() && now.Sub(r.skippedAt) < 2*grace {
		// The ticks in (start, now], the last of them fired.
		all := countTicks(r.sched, start, now.Add(time.Nanosecond))
		if latest := all.Last; all.Exact && latest.After(skipped.Last) && due(latest) {
			if run := countTicks(r.sched, start, latest); run.Exact && !run.empty() {
				return latest, run, true
			}
		}
	}
	first := r.sched.Next(skipped.Last)
	if !due(first) {
		return time.Time{}, tickRange{}, false
	}
	return first, skipped, true
}

// planSkip records ticks that do not fire (missed ticks the catch-up policy
// drops, or those due before a pause or removal), moving the watermark to the last of
// them, without creating a task.
func (s *Scheduler) planSkip(r *entryRun, skipped tickRange, reason string, now time.Time, into []taskstate.Fire) ([]taskstate.Fire, bool) {
	if skipped.empty() {
		return nil, false
	}
	rec, err := s.skippedRecord(r, skipped, reason, now)
	if err != nil {
		s.countError()
		s.log.Error("cannot build skipped record", "entry", r.id, "err", err)
		return nil, false
	}
	return append(into, taskstate.NewSkipFire(s.cfg.Names.Prefix(), r.queue, r.id, skipped.Last, r.cursor, r.hasCursor,
		[]taskstate.Record{rec})), false
}

// buildFire makes the fire of one tick of r, expecting the watermark at
// expected (hasExpected false: none).
func (s *Scheduler) buildFire(r *entryRun, tick, expected time.Time, hasExpected bool, now time.Time) (taskstate.Fire, error) {
	prefix := s.cfg.Names.Prefix()
	e := r.st.Entry
	tickText := s.tickText(tick)
	taskID := events.TaskIDOfTickText(prefix, r.id, tickText)
	msg := fireMessages.Get().(*taskstate.TaskMessage)
	fillTaskMessage(msg, e, taskID, tick, tickText, fireOrigin{})
	fired := s.firedRecord(r, tick, taskID, now)
	f := taskstate.NewTickFire(prefix, r.queue, r.id, tick, expected, hasExpected, msg, fired)
	f.UniqueTTL = e.Options.Unique.D()
	if e.Limited() {
		f.MaxFires, f.MaxFiresSince = e.MaxFires, r.st.MaxFiresSince
	}
	var err error
	if e.Overlap == events.OverlapSkip || e.Overlap == events.OverlapBufferOne {
		f.OverlapSkip = e.Overlap == events.OverlapSkip
		f.OverlapBuffer = !f.OverlapSkip
		if f.OverlapRecord, err = s.skippedRecord(r, tickRange{First: tick, Last: tick, Count: 1, Exact: true}, events.SkipOverlap, now); err != nil {
			return taskstate.Fire{}, err
		}
	}
	if e.Overlap == events.OverlapCancelPrevious {
		if f, err = s.cancelPreviousFire(r, f, now); err != nil {
			return taskstate.Fire{}, err
		}
	}
	if f.UniqueTTL > 0 {
		if f.DuplicateRecord, err = s.skippedRecord(r, tickRange{First: tick, Last: tick, Count: 1, Exact: true}, events.SkipUnique, now); err != nil {
			return taskstate.Fire{}, err
		}
	}
	return f, nil
}

// tickText is tick as TaskID writes it, remembered for the last tick: the
// fires of one instant share it, and a burst would otherwise format the
// same instant once per fire.
func (s *Scheduler) tickText(tick time.Time) string {
	if !tick.Equal(s.lastTick) || s.lastTickText == "" {
		s.lastTick, s.lastTickText = tick, events.FormatTaskTick(tick)
	}
	return s.lastTickText
}

func (s *Scheduler) source() string { return s.src }

// firedRecord is the outbox record of a scheduled tick's fired event, in
// the compact form the relay expands (outbox.AppendFiredRecord); its times
// come out in UTC, as in every activity event. Its data is a slice of
// s.firedData, which the next plan reuses: a burst then writes its records
// into the few buffers its batches pass on, not one allocation per fire.
func (s *Scheduler) firedRecord(r *entryRun, tick time.Time, taskID string, now time.Time) taskstate.Record {
	f := events.Fired{
		Entry: r.id, ScheduledAt: tick, EnqueuedAt: now, TaskID: taskID, Queue: r.queue,
		Revision: r.st.Revision, Replica: s.cfg.ReplicaID,
	}
	from := len(s.firedData)
	s.firedData = outbox.AppendFiredRecord(s.firedData, &f)
	// Capped, so a later record never writes into this one's room.
	return taskstate.Record{ID: firedEventID(r.id, tick), Data: s.firedData[from:len(s.firedData):len(s.firedData)]}
}

func (s *Scheduler) skippedRecord(r *entryRun, rng tickRange, reason string, now time.Time) (taskstate.Record, error) {
	id := skippedEventID(r.id, rng)
	rev := r.st.Revision
	if r.settle != nil && r.settle.reason == reason {
		rev = r.settle.revision // the pause or removal, even after a resume
	}
	data := events.Skipped{Entry: r.id, ScheduledAt: rng.First.UTC(), Reason: reason, Revision: rev, Replica: s.cfg.ReplicaID}
	if rng.Count > 1 {
		last := rng.Last.UTC()
		data.Until, data.Count = &last, rng.Count
	}
	ev, err := events.NewEventAt(id, now, events.TypeEntrySkipped, s.source(), r.id, data)
	if err != nil {
		return taskstate.Record{}, err
	}
	b, err := ev.Marshal()
	return taskstate.Record{ID: id, Data: b}, err
}

// grace is how old a tick of r may be and still fire: the catch-up grace
// and the largest jitter (a tick fires up to its jitter after it).
func (s *Scheduler) grace(r *entryRun) time.Duration {
	return s.cfg.Grace + r.sched.MaxJitter()
}
