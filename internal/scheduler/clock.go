package scheduler

import (
	"context"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
)

// Clock is the replica's one clock (clock): instants corrected to
// Redis TIME, durations monotonic.
type Clock = clock.Clock

// NewClock returns a clock corrected against source (Redis TIME).
func NewClock(source func(context.Context) (time.Time, error)) *Clock {
	return clock.New(source, clock.Options{})
}
