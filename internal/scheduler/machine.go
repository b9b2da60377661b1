package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// The entry state machine. Every entry this replica knows has one run in
// s.entries, and the run's state says where it stands. Every change of
// state is made in this file, through enter, which also keeps the indexes
// the loop works from (s.loading, the runs whose watermark is to be read;
// the heap, the runs by due instant; the queues the held-tick check
// reads, indexHeld) and the count of removed runs consistent with the
// state. docs/design.md "The entry state machine"
// draws it. TestEntryStateMachine (machine_test.go) reads this table and
// takes each row: a row added here fails it until it has its case.
//
//	state          | event                                        | next           | action
//	---------------+----------------------------------------------+----------------+--------------------------------------------------
//	(none)         | registered                                   | loading        | floor at the registration (register)
//	(none)         | found paused (at start, in a shard taken)    | loading        | the load decides the pause's settle (pause)
//	(none)         | paused before this replica loaded it         | known          | holds its state only (know)
//	(none)         | found removed (at start, in a shard taken)   | removedLoading | the load decides the removal's settle (foundRemoved)
//	known          | changed, still paused                        | known          | holds the new state
//	known          | resumed                                      | loading        | a new run (register)
//	loading        | changed; paused                              | loading        | new spec, floor or queue; a pause settles after the load
//	loading        | any change, while found paused               | loading        | the change waits for the load (foundStopped)
//	loading        | watermark read                               | ready          | cursor from the watermark, scheduled (loaded; a stop before a restart settles first)
//	loading        | watermark read, paused, ticks to settle      | ready          | settling: one skip step from the heap (loadStopped)
//	loading        | watermark read, paused, nothing to settle    | idle           | (rested)
//	ready          | due                                          | ready          | fire pass; the result moves the cursor or backs off (apply, passed)
//	ready          | changed, same queue; resumed                 | ready          | a new spec or a resume moves the floor; scheduled again
//	ready          | changed to another queue                     | loading        | closed in the old queue before it fires (loading.fromQueue)
//	ready          | paused                                       | ready          | settling, then out of the heap while paused
//	ready          | fire refused: max_fires reached              | ready          | completed: out of the heap until the limit changes (complete)
//	ready          | fire: watermark lost, or moved back here     | loading        | restored or reopened by the load (reload)
//	ready          | removed, ticks to settle                     | removing       | settling with reason removed (remove)
//	idle           | resumed                                      | loading        | floor at the resume
//	idle           | changed, still paused                        | idle           | -
//	removedLoading | any change, while found removed              | removedLoading | the change waits for the load (foundStopped)
//	removedLoading | watermark read, ticks to settle              | removing       | settling (loadStopped)
//	removedLoading | watermark read, nothing to settle            | (none)         | (rested)
//	removing       | settle recorded                              | (none)         | (schedule)
//	removing       | registered again                             | ready          | revived: the settle keeps the old schedule and floor
//	removing       | fire: watermark lost                         | (none)         | ticks left unrecorded, logged (reload)
//	known..idle    | removed, nothing to settle; quarantined      | (none)         | position forgotten (removeLive)
//	any            | shard dropped, moved to another's shard      | (none)         | position kept a while (dropRun)
//
// Backoffs after refusals and errors, catch-up, max_fires and the overlap
// policies are conditions the ready state's schedule, plan and the fire
// script follow, not states: a state is where the run is (which index
// holds it, whether its watermark is known).
type entryState uint8

const (
	// stateNone: the run is not held (new, or dropped); s.entries has no
	// run of it.
	stateNone entryState = iota
	// stateKnown: paused and never loaded here (paused before this replica
	// loaded it): only its registered state is held, for asynq's tools and
	// the entries gauge. It loads if it resumes.
	stateKnown
	// stateLoading: in s.loading until loadWatermarks has done what
	// r.loading asks (close the old queue, reopen this one, restore a lost
	// watermark, find when the schedule began) and read the watermark into
	// the cursor. Every registered entry starts here, and comes back here
	// when its queue changes live, or when a fire finds its watermark lost
	// (gone, or back before a tick it held) or moved out of its queue
	// although this replica's configuration, newer than the move, puts it
	// there (loading.reopen).
	stateLoading
	// stateReady: the watermark is known; the entry is in the heap by its
	// next due instant (its tick, a settle, a backoff), or out of it while
	// paused at rest, completed (max_fires reached) or past its last tick.
	stateReady
	// stateIdle: paused with its watermark unread (its load found nothing
	// to settle): neither loading nor in the heap; it loads if it resumes.
	stateIdle
	// stateRemovedLoading: removed before this replica started or took its
	// shard (foundRemoved): in s.loading, its watermark and history say
	// which ticks due before the removal are still to be recorded.
	stateRemovedLoading
	// stateRemoving: removed with ticks due before the removal that no
	// replica handled (stopSettle): in the heap until they are recorded,
	// then dropped. Registered again meanwhile, it is the entry's run
	// again (revived), so one run keeps the watermark's compare-and-set
	// ordered.
	stateRemoving
)

// loads reports whether a run in state st is in s.loading.
func (st entryState) loads() bool { return st == stateLoading || st == stateRemovedLoading }

// removed reports whether a run in state st is of a removed entry.
func (st entryState) removed() bool { return st == stateRemovedLoading || st == stateRemoving }

// fires reports whether a run in state st fires (or records its settle)
// from the heap: its watermark is known.
func (st entryState) fires() bool { return st == stateReady || st == stateRemoving }

// live reports whether a run in state st is of a registered entry this
// replica schedules (paused included), not one only known or removed.
func (st entryState) live() bool {
	return st == stateLoading || st == stateReady || st == stateIdle
}

// enter moves r to state to, keeping the indexes and the count of
// removed runs consistent with it; the heap takes the run only by
// schedule. Another run of the same entry in s.entries (only a known
// one can be there) is dropped.
func (s *Scheduler) enter(r *entryRun, to entryState) {
	if old := s.entries[r.id]; old != nil && old != r && to != stateNone {
		s.enter(old, stateNone)
	}
	from := r.state
	if from.loads() && !to.loads() && s.loading[r.id] == r {
		delete(s.loading, r.id)
	}
	if !to.fires() {
		s.heap.remove(r)
	}
	if from.removed() {
		s.removedRuns--
	}
	r.state = to
	s.indexHeld(r)
	if to == stateNone {
		if s.entries[r.id] == r {
			delete(s.entries, r.id)
		}
		return
	}
	if to.loads() {
		s.loading[r.id] = r
	}
	if to.removed() {
		s.removedRuns++
	}
	s.entries[r.id] = r
}

// liveRun is the run of a registered entry id this replica schedules
// (loading, ready or idle), nil when none.
func (s *Scheduler) liveRun(id string) *entryRun {
	if r := s.entries[id]; r != nil && r.state.live() {
		return r
	}
	return nil
}

// removedRun is the run of removed entry id whose settle goes on, nil
// when none.
func (s *Scheduler) removedRun(id string) *entryRun {
	if r := s.entries[id]; r != nil && r.state.removed() {
		return r
	}
	return nil
}

// applyChange follows the projection: entries join, change, pause, leave.
func (s *Scheduler) applyChange(c projector.Change) {
	if r := s.foundStopped(c.ID); r != nil {
		r.waiting = append(r.waiting, c)
		return
	}
	r := s.liveRun(c.ID)
	revived := false
	if r == nil && c.New != nil {
		if r = s.removedRun(c.ID); r != nil {
			// Registered again while its removal settles: one run keeps
			// the watermark's compare-and-set ordered.
			revived = true
			s.enter(r, revivedState(r.state))
		}
	}
	switch {
	case c.New == nil:
		s.removeLive(r, c)
	case c.New.Entry.Paused && revived:
		s.revivedPaused(r, *c.New)
	case c.New.Entry.Paused:
		s.pause(r, c)
	default:
		s.register(c.ID, r, *c.New, revived)
	}
}

// revivedState is the state of a removed run registered again.
func revivedState(st entryState) entryState {
	if st == stateRemovedLoading {
		return stateLoading
	}
	return stateReady
}

// removeLive follows the removal c of entry c.ID, whose live run is r
// (nil: none, or only known).
func (s *Scheduler) removeLive(r *entryRun, c projector.Change) {
	if r == nil {
		if k := s.entries[c.ID]; k != nil && k.state == stateKnown {
			s.enter(k, stateNone)
		}
		return
	}
	wasReady := r.state == stateReady
	s.enter(r, stateNone)
	s.pos.forget(c.ID)
	if !c.Quarantined {
		s.remove(r, c, wasReady)
	}
}

// register follows the registration or change, not paused, of entry id
// in state st, whose live run is r (nil: none); revived: r was removed.
func (s *Scheduler) register(id string, r *entryRun, st projector.State, revived bool) {
	sched, err := schedule.NewSchedule(st.Entry)
	if err != nil {
		// The projector validated the entry; this is a bug, not bad input.
		s.log.Error("entry has no usable schedule; not firing it", "entry", id, "err", err)
		if r == nil {
			r = s.entries[id] // known paused until now
		}
		if r != nil {
			s.enter(r, stateNone)
		}
		return
	}
	load := r == nil || r.state != stateReady
	if r == nil {
		r = &entryRun{id: id, index: -1, floor: st.Time, loading: loadSteps{floorAtLoad: true}}
	} else {
		old := r.st.Entry
		switch {
		case old.Paused || revived:
			if r.settle != nil && r.settle.sched == nil && !r.settle.until.IsZero() {
				// Its ticks from before the pause or removal are still to
				// be recorded, by the schedule and floor they belong to.
				r.settle.sched, r.settle.after = r.sched, r.floor
			}
			// Ticks while paused or removed are not missed: they never
			// fire.
			r.floor, r.loading.floorAtLoad = st.Time, false
		case old.Cron != st.Entry.Cron || old.Timezone != st.Entry.Timezone:
			// A new spec never fires ticks of the old one, nor its own
			// ticks from before the change.
			r.floor, r.loading.floorAtLoad = st.Time, false
		}
		if q := st.Entry.Options.QueueName(); q != r.queue && r.queue != "" {
			r.loading.fromQueue = r.queue
			load = true
		}
	}
	r.st, r.sched, r.queue = st, sched, st.Entry.Options.QueueName()
	s.indexHeld(r)
	r.tries = 0
	if load {
		s.enter(r, stateLoading)
		return
	}
	s.schedule(r, s.clock.Now())
}

// pause follows an entry's pause: the entry leaves the firing loop once
// the ticks due before the pause that no replica handled are recorded
// (stopSettle).
func (s *Scheduler) pause(r *entryRun, c projector.Change) {
	st := *c.New
	if r == nil {
		if c.Old != nil {
			s.know(c.ID, st) // paused before this replica loaded it: nothing new
			return
		}
		// Found paused (at start, or registered paused): if every replica
		// was down when the pause came, ticks due before it may be
		// unhandled. loadStopped finds out from its watermark and history.
		sched, err := schedule.NewSchedule(st.Entry)
		if err != nil {
			s.log.Error("entry has no usable schedule; not loading it", "entry", c.ID, "err", err)
			s.know(c.ID, st)
			return
		}
		r = &entryRun{id: c.ID, st: st, sched: sched, queue: st.Entry.Options.QueueName(), index: -1,
			floor: st.Time, loading: loadSteps{floorAtLoad: true}, settle: &stopSettle{reason: events.SkipPaused, revision: st.Revision}}
		s.enter(r, stateLoading)
		return
	}
	wasPaused := r.st.Entry.Paused
	r.st = st
	s.indexHeld(r)
	if wasPaused {
		return // still paused: a note or another field changed
	}
	now := s.clock.Now()
	r.settle = &stopSettle{reason: events.SkipPaused, revision: st.Revision, until: settleUntil(st.Time, now)}
	if r.state == stateLoading {
		return // loadStopped decides once the watermark is read
	}
	s.schedule(r, now)
}

// know holds paused entry id, in state st, that this replica has not
// loaded (stateKnown).
func (s *Scheduler) know(id string, st projector.State) {
	r := s.entries[id]
	if r == nil || r.state != stateKnown {
		r = &entryRun{id: id, index: -1}
	}
	r.st, r.queue = st, st.Entry.Options.QueueName()
	s.enter(r, stateKnown)
}

// foundStopped returns the run of entry id when it was found paused or
// removed at start and is still loading: which of its ticks were due
// before it stopped is read from its watermark and its history as of the
// state it was found in (loadStopped). A change that came meanwhile
// (resumed, registered again, removed) waits until then, and is applied
// as if seen live: a change applied now would take the run over before
// it knew what to record, and those ticks would go unrecorded.
func (s *Scheduler) foundStopped(id string) *entryRun {
	r := s.entries[id]
	if r == nil || !r.state.loads() || !r.loading.floorAtLoad || r.settle == nil || !r.settle.until.IsZero() {
		return nil
	}
	return r
}

// applyWaiting applies the changes that waited for r's load
// (foundStopped).
func (s *Scheduler) applyWaiting(r *entryRun) {
	waiting := r.waiting
	r.waiting = nil
	for _, c := range waiting {
		s.applyChange(c)
	}
}

// revivedPaused follows the registration, paused, of an entry whose
// removal still settles: nothing was due since the removal, so the settle
// goes on by the schedule and floor it belongs to, and the entry then
// rests paused.
func (s *Scheduler) revivedPaused(r *entryRun, st projector.State) {
	sched, err := schedule.NewSchedule(st.Entry)
	if err != nil {
		// The projector validated the entry; this is a bug, not bad input.
		s.log.Error("entry has no usable schedule; not firing it", "entry", r.id, "err", err)
		s.enter(r, stateNone)
		s.know(r.id, st)
		return
	}
	if r.settle != nil && r.settle.sched == nil && !r.settle.until.IsZero() {
		r.settle.sched, r.settle.after = r.sched, r.floor
	}
	r.st, r.sched, r.floor, r.loading.floorAtLoad = st, sched, st.Time, false
	s.indexHeld(r)
	if r.state == stateReady {
		s.schedule(r, s.clock.Now())
	}
}

// settleUntil is the last instant whose ticks were due before a pause or
// removal the stream stored at stored, applied at now.
func settleUntil(stored, now time.Time) time.Time {
	if stored.IsZero() || stored.After(now) {
		// Not a tick that is not due yet by this replica's clock.
		return now
	}
	return stored
}

// remove follows an entry's removal (r already dropped, wasReady its
// state was ready): ticks due before it that no replica handled are
// recorded as skipped (reason removed) first, by a run kept removing
// until they are (stopSettle): the removal event's time says which ticks
// were due, and the run knows the watermark. An entry still loading, or
// one that vanished without a removal event (c.Time zero: a recreated
// stream), goes at once.
func (s *Scheduler) remove(r *entryRun, c projector.Change, wasReady bool) {
	if !wasReady || c.Time.IsZero() {
		return
	}
	now := s.clock.Now()
	// A pause's settle still under way is kept: it goes first, and a
	// paused entry had nothing due since.
	if !r.settling() && !r.st.Entry.Paused {
		r.settle = &stopSettle{reason: events.SkipRemoved, revision: c.Seq, until: settleUntil(c.Time, now)}
	}
	if !r.settling() {
		return
	}
	s.enter(r, stateRemoving)
	s.schedule(r, now)
}

// foundRemoved follows the removal of an entry removed before this
// replica started (projector.Subscription.Removed): if every replica was
// down then, ticks due before it may be unhandled. Its run loads like an
// entry found paused (loadStopped: the watermark, and the history when a
// tick fell between the watermark and the removal) and settles like a
// removal seen live.
func (s *Scheduler) foundRemoved(c projector.Change) {
	if c.Old == nil {
		return
	}
	st := *c.Old
	sched, err := schedule.NewSchedule(st.Entry)
	if err != nil {
		return // a removal that names only its entry: nothing to go by
	}
	r := &entryRun{id: c.ID, st: st, sched: sched, queue: st.Entry.Options.QueueName(), index: -1,
		floor: st.Time, loading: loadSteps{floorAtLoad: true},
		settle: &stopSettle{reason: events.SkipRemoved, revision: c.Seq}}
	s.enter(r, stateRemovedLoading)
}

// loaded ends r's load with its watermark wm read: it fires from there
// (ready), or records the ticks due before its removal (removing).
func (s *Scheduler) loaded(r *entryRun, wm taskstate.WatermarkInfo, now time.Time) {
	r.skippedAt = time.Time{}
	r.cursor, r.hasCursor, r.lastTask = wm.Tick, wm.OK, wm.TaskID
	r.handled, r.hasHandled = wm.Tick, wm.OK
	if r.state == stateRemovedLoading {
		s.enter(r, stateRemoving)
	} else {
		s.enter(r, stateReady)
	}
	s.schedule(r, now)
}

// rested ends the load of an entry found paused or removed with nothing
// to settle: a paused one rests (idle) and loads in full if it resumes, a
// removed one goes.
func (s *Scheduler) rested(r *entryRun) {
	r.settle = nil
	if r.state == stateRemovedLoading {
		s.enter(r, stateNone)
		return
	}
	s.enter(r, stateIdle)
}

// reload sends r, found needing its watermark loaded again, back to
// loading. A removed entry's run goes instead: a load would have to
// restore the watermark of an entry the projection no longer holds.
func (s *Scheduler) reload(r *entryRun) {
	if r.state.removed() {
		s.enter(r, stateNone)
		s.log.Info("ticks due before the entry was removed left unrecorded: its watermark needs loading again", "entry", r.id)
		return
	}
	s.enter(r, stateLoading)
}

// dropRun takes r out of the loop: another replica owns its shard now.
// Its position is kept a while (positions.keep).
func (s *Scheduler) dropRun(r *entryRun) {
	s.enter(r, stateNone)
	s.pos.keep(r.id)
}

// complete follows a fire refused because r's max_fires is reached: r
// fires nothing more, out of the heap, while its limit counts from the
// same revision (completed).
func (s *Scheduler) complete(r *entryRun) {
	r.tries, r.completedSince = 0, r.st.MaxFiresSince
	s.heap.remove(r)
}

// completed reports whether r's fire limit was found reached: it then
// waits for a new limit (which counts from another revision), out of the
// heap.
func (r *entryRun) completed() bool {
	return r.completedSince != 0 && r.st.Entry.Limited() && r.completedSince == r.st.MaxFiresSince
}

// settling reports whether r's settle has ticks left to record, and drops
// the settle when not.
func (r *entryRun) settling() bool {
	if r.settle == nil {
		return false
	}
	if r.settle.until.IsZero() || r.completed() || r.settleTicks().empty() {
		r.settle = nil
		return false
	}
	return true
}

// passed places r after a fire pass planned at now and applied at
// applied: at once when more missed ticks are to follow, else by schedule.
// A run sent loading or dropped by its fires' results stays where they
// put it.
func (s *Scheduler) passed(r *entryRun, more bool, now, applied time.Time) {
	if !r.state.fires() {
		return
	}
	if more && r.tries == 0 && !r.completed() {
		// More missed ticks to fire: come back at once.
		s.heap.set(r, now)
		return
	}
	s.schedule(r, applied)
}

// schedule computes when this replica should next act on r, a ready or
// removing run, and places it in the heap; a removing run whose settle is
// done goes.
func (s *Scheduler) schedule(r *entryRun, now time.Time) {
	removed := r.state.removed()
	if !removed {
		s.pos.note(r, len(s.entries))
	}
	var due time.Time
	switch {
	case r.settling():
		due = r.settle.until
	case removed:
		s.enter(r, stateNone)
		return
	case r.st.Entry.Paused || r.completed():
		s.heap.remove(r)
		return
	default:
		next := r.next()
		if next.IsZero() {
			s.heap.remove(r)
			return
		}
		due = next.Add(r.sched.Jitter(next))
	}
	if r.tries > 0 {
		// Back off after refusals and errors, up to 5 s.
		due = maxTime(due, now.Add(min(time.Duration(r.tries)*200*time.Millisecond, 5*time.Second)))
	}
	s.heap.set(r, due)
}
