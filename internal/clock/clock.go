// Package clock is the one clock of a replica. Instants that are compared
// with ticks, leases or other replicas' instants come from Now: the local
// clock corrected by its offset to Redis TIME, so every replica decides
// "due" on one shared clock however far its own drifts. Durations (timeouts,
// backoffs, how long a condition lasted) use the monotonic clock (Mono,
// Since, Until), which no offset reaches.
//
// For fault tests a Clock can run on a local clock that is deliberately
// wrong (Options.LocalOffset): the real binary then behaves like a replica
// on a host whose clock is off, which libfaketime cannot simulate for Go.
// For simulations and tests that must not wait, it can run on a Manual
// clock (Options.Manual), which moves only when told to; the components'
// timers and tickers come from their Clock (NewTimer, NewTicker), so they
// follow it too.
package clock

import (
	"context"
	"sync"
	"time"
)

// Source reads the reference time (Redis TIME).
type Source func(context.Context) (time.Time, error)

// Options configure a Clock. The zero value is the plain local clock.
type Options struct {
	// LocalOffset shifts the local clock the corrections start from. For
	// tests only: it simulates a host whose clock is this far off.
	LocalOffset time.Duration
	// Manual, when set, is the local clock (tests and simulations): Now,
	// Mono and every Timer and Ticker of the Clock follow it.
	Manual *Manual
}

// Clock is the local clock corrected by its offset to a Source. The offset
// is measured at each Sync (a replica calls it at every heartbeat) from the
// midpoint of the round trip. Its methods are safe for concurrent use.
type Clock struct {
	source Source
	local  func() time.Time
	manual *Manual // nil: the real local clock

	mu       sync.RWMutex
	offset   time.Duration
	rtt      time.Duration
	measured bool
}

// New returns a clock corrected against source (nil: never corrected).
func New(source Source, opts Options) *Clock {
	base := time.Now
	if opts.Manual != nil {
		base = opts.Manual.Now
	}
	local := base
	if d := opts.LocalOffset; d != 0 {
		local = func() time.Time { return base().Add(d) }
	}
	return &Clock{source: source, local: local, manual: opts.Manual}
}

// Local returns an uncorrected clock (tests, tools without Redis).
func Local() *Clock { return New(nil, Options{}) }

// Sync measures the offset once. A round trip slower than the previous best
// by far (a GC pause, a slow network) does not replace a good measurement.
func (c *Clock) Sync(ctx context.Context) error {
	if c.source == nil {
		return nil
	}
	t0 := c.local()
	rt, err := c.source(ctx)
	if err != nil {
		return err
	}
	t1 := c.local()
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

// Now returns the corrected time. It keeps a monotonic reading, so the
// difference of two Nows taken across no Sync is a monotonic duration.
func (c *Clock) Now() time.Time {
	c.mu.RLock()
	off := c.offset
	c.mu.RUnlock()
	return c.local().Add(off)
}

// Offset returns the last measured offset to the source and whether one
// was measured.
func (c *Clock) Offset() (time.Duration, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.offset, c.measured
}

// Mono is a reading of the local monotonic clock (Clock.Mono): the start
// of a wait or the end of a backoff, for durations only. It is never an
// instant to compare with Now's or with ticks, which is why it is a type of
// its own. The zero Mono lies long in the past.
type Mono struct{ t time.Time }

// Mono reads the local monotonic clock, which no offset reaches: a Sync
// between two readings does not stretch or shrink the duration between
// them.
func (c *Clock) Mono() Mono { return Mono{c.local()} }

// Since returns the monotonic time elapsed since m.
func (c *Clock) Since(m Mono) time.Duration { return c.local().Sub(m.t) }

// Until returns the monotonic time left until m (negative once past).
func (c *Clock) Until(m Mono) time.Duration { return m.t.Sub(c.local()) }

// Add returns m moved by d.
func (m Mono) Add(d time.Duration) Mono { return Mono{m.t.Add(d)} }

// IsZero reports whether m is the zero Mono (no reading).
func (m Mono) IsZero() bool { return m.t.IsZero() }

// Before reports whether m is earlier than o.
func (m Mono) Before(o Mono) bool { return m.t.Before(o.t) }
