package scheduler

import (
	"github.com/cronstream/cronstream/internal/taskstate"
)

// fireStatus is s as a FireStatus; the two lists are the same, in the
// same order (TestFireStatusMatches).
func fireStatus(s taskstate.FireStatus) FireStatus { return FireStatus(s) }

func (s *Scheduler) outcome(o Outcome) {
	if s.cfg.OnOutcome != nil {
		s.cfg.OnOutcome(o)
	}
}
