package scheduler

import (
	"testing"

	"github.com/cronstream/cronstream/internal/taskstate"
)

// fireStatus converts by number: both lists must hold the same statuses in
// the same order.
func TestFireStatusMatches(t *testing.T) {
	for ts, want := range map[taskstate.FireStatus]FireStatus{
		taskstate.StatusFired:             StatusFired,
		taskstate.StatusAlreadyExists:     StatusAlreadyExists,
		taskstate.StatusDuplicate:         StatusDuplicate,
		taskstate.StatusSkippedOverlap:    StatusSkippedOverlap,
		taskstate.StatusSkippedMissed:     StatusSkippedMissed,
		taskstate.StatusHeld:              StatusHeld,
		taskstate.StatusWatermarkMismatch: StatusWatermarkMismatch,
		taskstate.StatusMoved:             StatusMoved,
		taskstate.StatusRevisionFenced:    StatusRevisionFenced,
		taskstate.StatusStale:             StatusStale,
	} {
		if got := fireStatus(ts); got != want || got.String() != ts.String() || got.Refused() != ts.Refused() {
			t.Errorf("fireStatus(%s) = %s (refused %v), want %s", ts, got, got.Refused(), want)
		}
	}
}
