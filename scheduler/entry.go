package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/projector"
)

// entryRun is the scheduler's state of one registered entry.
type entryRun struct {
	id    string
	st    projector.State
	sched *Schedule
	queue string

	// cursor is the entry's last handled (fired or skipped) tick in its
	// queue, as last known; known says whether it was read from Redis or
	// learned from a fire.
	cursor    time.Time
	hasCursor bool
	known     bool
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
	// floorAtLoad: floor is the entry's last config time as found at
	// start, not a schedule change seen live (see scheduleSince).
	floorAtLoad bool
	// fromQueue is a queue the entry must be closed in before it fires in
	// queue (a queue change seen live).
	fromQueue string
	// reopen: the entry's queue slot was found closed by an older handover
	// (the entry moved away and back); it is reopened from the history.
	reopen bool
	// restored: a lost watermark was looked for in the activity stream.
	restored bool
	// heard is a tick a fire of which was heard on the activity subjects
	// while it was the entry's next: a hint only (see applyObservation).
	heard time.Time

	due   time.Time
	index int
	tries int // consecutive refusals/errors, for backoff
	// recorded counts asynq history events written for the entry; its
	// history is trimmed on every historyTrimEvery-th.
	recorded uint32

	// The last Next computed: schedule computes the tick after start,
	// and plan needs the same one when it comes due.
	memoSched    *Schedule
	memoFrom     time.Time
	memoNext     time.Time
	memoComputed bool
}

// next returns r's first tick after start() (zero when none).
func (r *entryRun) next() time.Time {
	from := r.start()
	if !r.memoComputed || r.memoSched != r.sched || !r.memoFrom.Equal(from) {
		r.memoSched, r.memoFrom, r.memoNext, r.memoComputed = r.sched, from, r.sched.Next(from), true
	}
	return r.memoNext
}

// applyChange follows the projection: entries join, change, pause, leave.
func (s *Scheduler) applyChange(c projector.Change) {
	r := s.entries[c.ID]
	if c.New != nil && c.New.Entry.Paused {
		if s.pausedEntries == nil {
			s.pausedEntries = map[string]projector.State{}
		}
		s.pausedEntries[c.ID] = *c.New
	} else {
		delete(s.pausedEntries, c.ID)
	}
	if c.New == nil || c.New.Entry.Paused {
		if r != nil {
			s.heap.remove(r)
			delete(s.load, r.id)
			if c.New == nil {
				delete(s.entries, c.ID)
			} else {
				r.st = *c.New
			}
		}
		return
	}
	st := *c.New
	sched, err := NewSchedule(st.Entry)
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
		r = &entryRun{id: c.ID, index: -1, floor: st.Time, floorAtLoad: true}
		s.entries[c.ID] = r
	} else {
		old := r.st.Entry
		switch {
		case old.Paused:
			// Ticks while paused are not missed: they never fire.
			r.floor, r.floorAtLoad = st.Time, false
		case old.Cron != st.Entry.Cron || old.Timezone != st.Entry.Timezone:
			// A new spec never fires ticks of the old one, nor its own
			// ticks from before the change.
			r.floor, r.floorAtLoad = st.Time, false
		}
		if q := st.Entry.Options.QueueName(); q != r.queue && r.queue != "" {
			r.fromQueue = r.queue
			r.known = false
		}
	}
	r.st, r.sched, r.queue = st, sched, st.Entry.Options.QueueName()
	r.tries = 0
	if !r.known {
		s.heap.remove(r)
		s.load[r.id] = r
		return
	}
	s.schedule(r, s.clock.Now())
}

// schedule computes when this replica should next act on r and places it
// in the heap.
func (s *Scheduler) schedule(r *entryRun, now time.Time) {
	next := r.next()
	if next.IsZero() {
		s.heap.remove(r)
		return
	}
	due := next.Add(r.sched.Jitter(next))
	if primaryOf(r.id, s.live) != s.cfg.ReplicaID && len(s.live) > 0 {
		due = due.Add(s.cfg.LateDelay)
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
