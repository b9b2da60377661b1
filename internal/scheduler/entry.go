package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// entryRun is the scheduler's state of one registered entry.
type entryRun struct {
	id    string
	st    projector.State
	sched *schedule.Schedule
	queue string

	// phase is where the entry stands on this replica (entryPhase);
	// loading is what its load involves besides reading the watermark.
	phase   entryPhase
	loading loadSteps
	// waiting are the changes that came while the entry, found paused or
	// removed at start, loaded (foundStopped): applied in order once its
	// load has read what was due before it stopped.
	waiting []projector.Change

	// cursor is the entry's last handled (fired or skipped) tick in its
	// queue, as last known: read from Redis or learned from a fire.
	// hasCursor is false when the queue holds no watermark for it (it never
	// fired there). Both are data of either phase, not a phase: an entry
	// loading again keeps the cursor it had.
	cursor    time.Time
	hasCursor bool
	lastTask  string

	// handled is the last tick this replica knows the watermark held: read
	// from Redis or written by its own fire (cursor may come from observed
	// events, backfills among them, which prove nothing of the watermark).
	// A watermark found missing or older than it means Redis lost data; it
	// is kept to restore the watermark then.
	handled    time.Time
	hasHandled bool
	// floor: ticks at or before it are never fired (they belong to a pause
	// or to an earlier spec).
	floor time.Time
	// skippedAt is when a fire of this replica that recorded missed ticks
	// of the entry last committed. Found with missed ticks again soon
	// after, the entry is one this replica does not keep up with (see
	// dueAfterSkip). Only a committed step counts: a step refused, or
	// held while a lost watermark is restored, says nothing of the
	// replica's pace, and loading clears it.
	skippedAt time.Time

	// settle, while set, is a pause or removal that took effect with ticks
	// due before it that no replica had handled (every replica was down,
	// or Redis failing): they are recorded as skipped (reason paused or
	// removed) through the fire script's compare-and-set, as missed ticks
	// are, before the entry rests or goes, so neither leaves a hole in the
	// audit log.
	settle *stopSettle
	// removed: the entry was removed while its settle had ticks left. Its
	// run is then in s.removing instead of s.entries, and in the heap until
	// the settle is done (remove); registered again meanwhile, it is the
	// entry's run again, as a resumed one is.
	removed bool

	// completedSince is the revision of the fire limit found reached (a
	// fire refused as completed): the entry fires nothing more while its
	// limit counts from there (completed).
	completedSince uint64

	due   time.Time
	index int
	// backlogged: the entry waits in s.backlog for a pass (fairShare).
	backlogged bool
	// tries counts consecutive refusals and errors, whatever the phase:
	// schedule backs off by it.
	tries int
	// recorded counts asynq history events written for the entry; its
	// history is trimmed on every historyTrimEvery-th.
	recorded uint32

	// The last Next computed: schedule computes the tick after start,
	// and plan needs the same one when it comes due.
	memoSched    *schedule.Schedule
	memoFrom     time.Time
	memoNext     time.Time
	memoComputed bool
}

// entryPhase is where an entry stands on this replica: loading (its
// watermark is to be read) or ready (the watermark is known and the entry
// fires on its schedule). A paused entry keeps its phase but is neither in
// s.load nor in the heap, except while its pause settles (stopSettle: in
// s.load until its watermark is read, then in the heap until the ticks due
// before the pause are recorded); applyChange puts it back where its phase
// says when it resumes.
type entryPhase uint8

const (
	// phaseLoading: the entry waits in s.load, not in the heap, until
	// loadWatermarks has done what r.loading asks (close the old queue,
	// reopen this one, restore a lost watermark, find when the schedule
	// began) and read the watermark into the cursor; that moves it to
	// phaseReady. Every entry starts here (applyChange: a registration, or
	// the entry as found at start, with loading.floorAtLoad), and comes back
	// here when
	//   - its queue changes live (applyChange, with loading.fromQueue);
	//   - a fire finds its watermark vanished or gone back before a tick it
	//     held (apply: Redis lost data; the load restores it);
	//   - a fire finds it moved out of its queue although this replica's
	//     configuration, newer than the move, puts it there (apply, with
	//     loading.reopen).
	phaseLoading entryPhase = iota
	// phaseReady: the watermark is known; the entry waits in the heap for
	// its next due instant (schedule), fires from there (fireDue), and
	// stays ready after a fire, a refusal or an error (apply) unless one of
	// the cases above sends it back to phaseLoading.
	phaseReady
)

// loadSteps is what loading an entry involves besides reading its
// watermark (phaseLoading). loadWatermarks clears each step as it is done;
// a step that fails leaves the entry loading, to be retried.
type loadSteps struct {
	// fromQueue is a queue the entry must be closed in before it fires in
	// queue (a queue change seen live).
	fromQueue string
	// reopen: the entry's queue slot was found closed by an older handover
	// (the entry moved away and back); it is reopened from the history.
	reopen bool
	// floorAtLoad: floor is the entry's last config time as found at
	// start, not a schedule change seen live (see scheduleSince).
	floorAtLoad bool
	// restored: a lost watermark was looked for in the activity stream
	// during this load (once per load: the stream may hold nothing usable).
	restored bool
	// seed is what this replica proposes for a lost watermark while the
	// restore proposal settles, and held whether the entry's fires are
	// held for it (restore.go).
	seed *restoreSeed
	held bool
}

// stopSettle is a pause or removal whose due ticks are still to be
// recorded.
type stopSettle struct {
	// reason is the skip reason the ticks are recorded with
	// (events.SkipPaused or events.SkipRemoved), and revision the config
	// event's that stopped the entry, which the skipped event names.
	reason   string
	revision uint64
	// until is when the pause or removal took effect (its event's stream
	// time, at most the clock when it was applied): ticks at or before it
	// were due before it. Zero until loadStopped has read it from the
	// history of an entry found paused or removed.
	until time.Time
	// sched and after are the schedule and floor of before the pause, kept
	// when the entry resumes before the settle committed (the resume moves
	// the floor and may change the spec). Unset, the entry's own still are.
	sched *schedule.Schedule
	after time.Time
}

// settleTicks is the run of r's ticks its settle still has to record:
// after its floor and cursor, up to the pause or removal.
func (r *entryRun) settleTicks() tickRange {
	p := r.settle
	sched, after := r.sched, r.floor
	if p.sched != nil {
		sched, after = p.sched, p.after
	}
	if r.hasCursor && r.cursor.After(after) {
		after = r.cursor
	}
	return countTicks(sched, after, p.until.Add(time.Nanosecond))
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

// next returns r's first tick after start() (zero when none).
func (r *entryRun) next() time.Time {
	from := r.start()
	if !r.memoComputed || r.memoSched != r.sched || !r.memoFrom.Equal(from) {
		r.memoSched, r.memoFrom, r.memoNext, r.memoComputed = r.sched, from, r.sched.Next(from), true
	}
	return r.memoNext
}

// pausedOnlyOne is 1 when id is a paused entry this replica never loaded.
func (s *Scheduler) pausedOnlyOne(id string) int {
	if _, paused := s.pausedEntries[id]; !paused {
		return 0
	}
	if _, loaded := s.entries[id]; loaded {
		return 0
	}
	return 1
}

// applyChange follows the projection: entries join, change, pause, leave.
func (s *Scheduler) applyChange(c projector.Change) {
	if r := s.foundStopped(c.ID); r != nil {
		r.waiting = append(r.waiting, c)
		return
	}
	s.pausedOnly -= s.pausedOnlyOne(c.ID)
	defer func() { s.pausedOnly += s.pausedOnlyOne(c.ID) }()
	r := s.entries[c.ID]
	revived := false
	if r == nil && c.New != nil {
		if r = s.removing[c.ID]; r != nil {
			// Registered again while its removal settles: one run keeps
			// the watermark's compare-and-set ordered.
			delete(s.removing, c.ID)
			r.removed, revived = false, true
			s.entries[c.ID] = r
		}
	}
	if c.New != nil && c.New.Entry.Paused {
		if s.pausedEntries == nil {
			s.pausedEntries = map[string]projector.State{}
		}
		s.pausedEntries[c.ID] = *c.New
	} else {
		delete(s.pausedEntries, c.ID)
	}
	if c.New == nil {
		if r != nil {
			s.heap.remove(r)
			delete(s.load, r.id)
			delete(s.entries, c.ID)
			s.pos.forget(c.ID)
			if !c.Quarantined {
				s.remove(r, c)
			}
		}
		return
	}
	if c.New.Entry.Paused {
		if revived {
			s.revivedPaused(r, *c.New)
			return
		}
		s.pause(r, c)
		return
	}
	st := *c.New
	sched, err := schedule.NewSchedule(st.Entry)
	if err != nil {
		// The projector validated the entry; this is a bug, not bad input.
		s.log.Error("entry has no usable schedule; not firing it", "entry", c.ID, "err", err)
		if r != nil {
			s.heap.remove(r)
			delete(s.entries, c.ID)
		}
		return
	}
	if r == nil {
		r = &entryRun{id: c.ID, index: -1, phase: phaseLoading, floor: st.Time, loading: loadSteps{floorAtLoad: true}}
		s.entries[c.ID] = r
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
			r.phase = phaseLoading
		}
	}
	r.st, r.sched, r.queue = st, sched, st.Entry.Options.QueueName()
	r.tries = 0
	if r.phase == phaseLoading {
		s.heap.remove(r)
		s.load[r.id] = r
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
			return // paused before this replica loaded it: nothing new
		}
		// Found paused (at start, or registered paused): if every replica
		// was down when the pause came, ticks due before it may be
		// unhandled. loadStopped finds out from its watermark and history.
		sched, err := schedule.NewSchedule(st.Entry)
		if err != nil {
			s.log.Error("entry has no usable schedule; not loading it", "entry", c.ID, "err", err)
			return
		}
		r = &entryRun{id: c.ID, st: st, sched: sched, queue: st.Entry.Options.QueueName(), index: -1,
			phase: phaseLoading, floor: st.Time, loading: loadSteps{floorAtLoad: true}, settle: &stopSettle{reason: events.SkipPaused, revision: st.Revision}}
		s.entries[c.ID] = r
		s.load[r.id] = r
		return
	}
	wasPaused := r.st.Entry.Paused
	r.st = st
	if wasPaused {
		return // still paused: a note or another field changed
	}
	now := s.clock.Now()
	r.settle = &stopSettle{reason: events.SkipPaused, revision: st.Revision, until: settleUntil(st.Time, now)}
	if r.phase == phaseLoading {
		return // in s.load: loadStopped decides once the watermark is read
	}
	s.schedule(r, now)
}

// foundStopped returns the run of entry id when it was found paused or
// removed at start and is still loading: which of its ticks were due
// before it stopped is read from its watermark and its history as of the
// state it was found in (loadStopped). A change that came meanwhile
// (resumed, registered again, removed) waits until then, and is applied
// as if seen live: a change applied now would take the run over before
// it knew what to record, and those ticks would go unrecorded.
func (s *Scheduler) foundStopped(id string) *entryRun {
	r := s.removing[id]
	if r == nil {
		r = s.entries[id]
	}
	if r == nil || r.phase != phaseLoading || !r.loading.floorAtLoad || r.settle == nil || !r.settle.until.IsZero() {
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
		s.heap.remove(r)
		delete(s.entries, r.id)
		delete(s.load, r.id)
		return
	}
	if r.settle != nil && r.settle.sched == nil && !r.settle.until.IsZero() {
		r.settle.sched, r.settle.after = r.sched, r.floor
	}
	r.st, r.sched, r.floor, r.loading.floorAtLoad = st, sched, st.Time, false
	if r.phase == phaseReady {
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

// remove follows an entry's removal (r already out of s.entries, s.load
// and the heap): ticks due before it that no replica handled are recorded
// as skipped (reason removed) first, by a run kept in the heap alone until
// they are (stopSettle): the removal event's time says which ticks were
// due, and the run knows the watermark. An entry still loading, or one
// that vanished without a removal event (c.Time zero: a recreated
// stream), goes at once.
func (s *Scheduler) remove(r *entryRun, c projector.Change) {
	if r.phase != phaseReady || c.Time.IsZero() {
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
	r.removed = true
	if s.removing == nil {
		s.removing = map[string]*entryRun{}
	}
	s.removing[r.id] = r
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
		phase: phaseLoading, floor: st.Time, loading: loadSteps{floorAtLoad: true}, removed: true,
		settle: &stopSettle{reason: events.SkipRemoved, revision: c.Seq}}
	if s.removing == nil {
		s.removing = map[string]*entryRun{}
	}
	s.removing[r.id] = r
	s.load[r.id] = r
}

// forgetRemoved drops a removed entry's run once its settle is done or
// given up.
func (s *Scheduler) forgetRemoved(r *entryRun) {
	s.heap.remove(r)
	if s.removing[r.id] == r {
		delete(s.removing, r.id)
	}
	if s.load[r.id] == r {
		delete(s.load, r.id)
	}
}

// completed reports whether r's fire limit was found reached: it then
// waits for a new limit (which counts from another revision), out of the
// heap.
func (r *entryRun) completed() bool {
	return r.completedSince != 0 && r.st.Entry.Limited() && r.completedSince == r.st.MaxFiresSince
}

// schedule computes when this replica should next act on r and places it
// in the heap.
func (s *Scheduler) schedule(r *entryRun, now time.Time) {
	if !r.removed {
		s.pos.note(r)
	}
	var due time.Time
	switch {
	case r.settling():
		due = r.settle.until
	case r.removed:
		s.forgetRemoved(r)
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

// start is the instant after which r's ticks are still to be handled.
func (r *entryRun) start() time.Time {
	s := r.floor
	if r.hasCursor && r.cursor.After(s) {
		s = r.cursor
	}
	return s
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
