package scheduler

import (
	"time"

	"github.com/cronstream/cronstream/events"
)

// Event ids are derived from what they describe, so the same fact always
// has the same id (and the stream drops a republished one), and observers
// can read entry and tick off the Nats-Msg-Id header without decoding.
// Their formats live in events (ids.go).
func firedEventID(entry string, tick time.Time) string {
	return events.FiredEventID(entry, tick)
}

func skippedEventID(entry string, r tickRange) string {
	if r.Count <= 1 {
		return events.SkippedEventID(entry, r.Last)
	}
	return events.SkippedRangeEventID(entry, r.First, r.Last)
}
