package scheduler

import (
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// fireStatus is s as a FireStatus; the two lists are the same, in the
// same order (TestFireStatusMatches).
func fireStatus(s taskstate.FireStatus) schedule.FireStatus { return schedule.FireStatus(s) }

func (s *Scheduler) outcome(o schedule.Outcome) {
	if s.cfg.OnOutcome != nil {
		s.cfg.OnOutcome(o)
	}
}
