package scheduler

import (
	"context"
	"sync"
	"time"
)

// Clock is the replica's clock corrected by its offset to Redis TIME, so
// every replica decides "due" on one shared clock however far its own
// drifts. The offset is measured at each Sync (the replica calls it at
// every heartbeat) from the midpoint of the round trip.
type Clock struct {
	source func(context.Context) (time.Time, error)
	now    func() time.Time

	mu       sync.RWMutex
	offset   time.Duration
	rtt      time.Duration
	measured bool
}

// NewClock returns a clock corrected against source (Redis TIME).
func NewClock(source func(context.Context) (time.Time, error)) *Clock {
	return &Clock{source: source, now: time.Now}
}

// Sync measures the offset once. A round trip slower than the previous best
// by far (a GC pause, a slow network) does not replace a good measurement.
func (c *Clock) Sync(ctx context.Context) error {
	t0 := c.now()
	rt, err := c.source(ctx)
	if err != nil {
		return err
	}
	t1 := c.now()
	rtt := t1.Sub(t0)
	offset := rt.Sub(t0.Add(rtt / 2))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.measured && rtt > 4*c.rtt+10*time.Millisecond {
		// Too noisy to trust; forget the old best slowly so a changed
		// network path is picked up eventually.
		c.rtt += c.rtt / 4
		return nil
	}
	c.offset, c.rtt, c.measured = offset, rtt, true
	return nil
}

// Now returns the corrected time.
func (c *Clock) Now() time.Time {
	c.mu.RLock()
	off := c.offset
	c.mu.RUnlock()
	return c.now().Add(off)
}

// Offset returns the last measured offset to Redis TIME and whether one was
// measured.
func (c *Clock) Offset() (time.Duration, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.offset, c.measured
}
