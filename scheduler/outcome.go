package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/taskstate"
)

// Outcome is what became of one attempt to handle an entry's tick.
type Outcome struct {
	Entry string
	// Tick is zero when no tick was attempted (the watermark could not be
	// read).
	Tick   time.Time
	Status taskstate.FireStatus // zero when Err is set
	Err    error
}

func (s *Scheduler) outcome(o Outcome) {
	if s.cfg.OnOutcome != nil {
		s.cfg.OnOutcome(o)
	}
}
