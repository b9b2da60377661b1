package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// entryRun is the scheduler's state of one registered entry.
type entryRun struct {
	id    string
	st    projector.State
	sched *schedule.Schedule
	queue string

	// state is where the entry stands on this replica (machine.go);
	// loading is what its load involves besides reading the watermark.
	state   entryState
	loading loadSteps
	// waiting are the changes that came while the entry, found paused or
	// removed at start, loaded (foundStopped): applied in order once its
	// load has read what was due before it stopped.
	waiting []projector.Change

	// cursor is the entry's last handled (fired or skipped) tick in its
	// queue, as last known: read from Redis or learned from a fire.
	// hasCursor is false when the queue holds no watermark for it (it never
	// fired there). Both are data of any state, not a state: an entry
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

	// completedSince is the revision of the fire limit found reached (a
	// fire refused as completed): the entry fires nothing more while its
	// limit counts from there (completed).
	completedSince uint64

	due   time.Time
	index int
	// backlogged: the entry waits in s.backlog for a pass (fairShare).
	backlogged bool
	// holdsIn is the queue whose held ticks the release check reads for
	// this run (heldCheck.entries counts it there), "" when none.
	holdsIn string
	// tries counts consecutive refusals and errors, whatever the state:
	// schedule backs off by it.
	tries int
	// recorded counts asynq history events written for the entry; its
	// history is trimmed on every historyTrimEvery-th.
	recorded uint32

	// pos is the position this run noted for restores (positions.note;
	// nil: none yet).
	pos *position

	// The last Next computed: schedule computes the tick after start,
	// and plan needs the same one when it comes due.
	memoSched    *schedule.Schedule
	memoFrom     time.Time
	memoNext     time.Time
	memoComputed bool
}

// loadSteps is what loading an entry involves besides reading its
// watermark (stateLoading). loadWatermarks clears each step as it is done;
// a step that fails leaves the entry loading, to be retried.
type loadSteps struct {
	// fromQueue is a queue the entry must be closed in before it fires in
	// queue (a queue change seen live).
	fromQueue string
	// reopen: the entry's queue slot was found closed by an older handover
	// (the entry moved away and back); it is reopened from the history.
	reopen bool
	// floorAtLoad: floor is the entry's last config time as found at
	// start, not a schedule change seen live (see scheduleStart).
	floorAtLoad bool
	// restored: a lost watermark was looked for in the activity stream
	// during this load (once per load: the stream may hold nothing usable).
	restored bool
	// seed is what this replica proposes for a lost watermark while the
	// restore proposal settles, and held whether the entry's fires are
	// held for it (restore.go); heldUntil is when the proposal is to be
	// read again.
	seed      *restoreSeed
	held      bool
	heldUntil clock.Mono
	// checkSince: the load waits for the activity stream's last fire of
	// the entry, which it asked for then (zero: not asking; lastFireOf),
	// until checkBy at most (zero: until the read ends; checkDeadline).
	checkSince clock.Mono
	checkBy    clock.Mono
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

// next returns r's first tick after start() (zero when none).
func (r *entryRun) next() time.Time {
	from := r.start()
	if !r.memoComputed || r.memoSched != r.sched || !r.memoFrom.Equal(from) {
		r.memoSched, r.memoFrom, r.memoNext, r.memoComputed = r.sched, from, r.sched.Next(from), true
	}
	return r.memoNext
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
