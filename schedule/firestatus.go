package schedule

import (
	"strconv"
	"time"
)

// FireStatus is what became of one fire that Redis answered: fired, or
// skipped, or refused (Refused) and changed nothing.
type FireStatus int

// The statuses of a fire, as the fire script reports them.
const (
	// StatusFired: the task was created.
	StatusFired FireStatus = iota + 1
	// StatusAlreadyExists: the task id exists already (the tick fired
	// before, or the trigger's request id was served).
	StatusAlreadyExists
	// StatusDuplicate: asynq's unique lock is held by another task; the
	// tick is recorded as skipped.
	StatusDuplicate
	// StatusSkippedOverlap: the entry's previous task is still running and
	// its overlap policy is skip; the tick is recorded as skipped.
	StatusSkippedOverlap
	// StatusSkippedMissed: missed ticks were recorded as skipped.
	StatusSkippedMissed
	// StatusHeld: the entry's previous task is busy and its overlap policy
	// is buffer-one; the tick is held in Redis and fires when that task is
	// done.
	StatusHeld
	// StatusWatermarkMismatch: refused, the watermark is not what the fire
	// expected (another replica handled the tick, or Redis lost data).
	StatusWatermarkMismatch
	// StatusMoved: refused, the entry moved out of the queue.
	StatusMoved
	// StatusRevisionFenced: refused, a replica fired into the queue from a
	// newer configuration.
	StatusRevisionFenced
	// StatusStale: refused, this replica's view of the configuration lags
	// the freshest replica's by more than MaxStaleness.
	StatusStale
	// StatusCompleted: refused, the entry's max fires ticks already created
	// a task; it fires nothing more.
	StatusCompleted
)

// String names the status as metrics and logs do ("fired", "stale", ...).
func (s FireStatus) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return "FireStatus(" + strconv.Itoa(int(s)) + ")"
}

// Refused reports whether the fire was refused: it changed nothing.
func (s FireStatus) Refused() bool { return s >= StatusWatermarkMismatch }

var statusNames = map[FireStatus]string{
	StatusFired:             "fired",
	StatusAlreadyExists:     "already-exists",
	StatusDuplicate:         "duplicate",
	StatusSkippedOverlap:    "skipped-overlap",
	StatusSkippedMissed:     "skipped-missed",
	StatusHeld:              "held",
	StatusWatermarkMismatch: "watermark-mismatch",
	StatusMoved:             "moved",
	StatusRevisionFenced:    "revision-fenced",
	StatusStale:             "stale",
	StatusCompleted:         "completed",
}

// Outcome is what became of one attempt to handle an entry's tick.
type Outcome struct {
	Entry string
	// Tick is zero when no tick was attempted (the watermark could not be
	// read).
	Tick   time.Time
	Status FireStatus // zero when Err is set
	Err    error
	// Missed: the fire also recorded ticks before Tick as skipped, missed
	// (their time was past the catch-up grace when they came to fire): the
	// entry fires behind its schedule, or no replica ran.
	Missed bool
}
