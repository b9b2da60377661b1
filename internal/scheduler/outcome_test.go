package scheduler

import (
	"testing"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// fireStatus converts by number: both lists must hold the same statuses in
// the same order.
func TestFireStatusMatches(t *testing.T) {
	for ts, want := range map[taskstate.FireStatus]schedule.FireStatus{
		taskstate.StatusFired:             schedule.StatusFired,
		taskstate.StatusAlreadyExists:     schedule.StatusAlreadyExists,
		taskstate.StatusDuplicate:         schedule.StatusDuplicate,
		taskstate.StatusSkippedOverlap:    schedule.StatusSkippedOverlap,
		taskstate.StatusSkippedMissed:     schedule.StatusSkippedMissed,
		taskstate.StatusHeld:              schedule.StatusHeld,
		taskstate.StatusWatermarkMismatch: schedule.StatusWatermarkMismatch,
		taskstate.StatusMoved:             schedule.StatusMoved,
		taskstate.StatusRevisionFenced:    schedule.StatusRevisionFenced,
		taskstate.StatusStale:             schedule.StatusStale,
		taskstate.StatusCompleted:         schedule.StatusCompleted,
	} {
		if got := fireStatus(ts); got != want || got.String() != ts.String() || got.Refused() != ts.Refused() {
			t.Errorf("fireStatus(%s) = %s (refused %v), want %s", ts, got, got.Refused(), want)
		}
	}
}
