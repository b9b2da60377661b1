package contract

import (
	"errors"
	"fmt"
	"time"
)

// ErrCatchupBeyondRetention: an entry's catch-up window reaches back further
// than the activity stream keeps fired events. Catch-up, backfill and the
// restore of a watermark after Redis data loss read the fired events to
// know what already ran; a tick older than the retention has no record left,
// so it could fire again.
var ErrCatchupBeyondRetention = errors.New("catch-up window longer than the activity stream's retention")

// CatchupBeyondRetention returns an error wrapping ErrCatchupBeyondRetention
// naming both durations when e catches up (policy latest or all) over a
// window longer than maxAge, the activity stream's max age (0 keeps events
// forever).
func CatchupBeyondRetention(e Entry, maxAge time.Duration) error {
	n := e.Normalize()
	if maxAge <= 0 || n.Catchup.Policy == CatchupNone || time.Duration(n.Catchup.Window) <= maxAge {
		return nil
	}
	return fmt.Errorf("entry %s: %w: its catch-up window is %s, the activity stream keeps events for %s (--activity-max-age); shorten --catchup-window or raise the activity max age with `cronstream streams apply`",
		e.ID, ErrCatchupBeyondRetention, time.Duration(n.Catchup.Window), maxAge)
}
