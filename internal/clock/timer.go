package clock

import "time"

// Timer is a time.Timer of a Clock: a real one, or one of its Manual
// clock's. Reset and Stop drop a value that was delivered and not
// received, as time.Timer's do since Go 1.23.
type Timer struct {
	C  <-chan time.Time
	rt *time.Timer
	mt *manualTimer
}

// NewTimer returns a timer that delivers on C once d has passed on c's
// local clock (monotonic, like Mono).
func (c *Clock) NewTimer(d time.Duration) *Timer {
	if c.manual != nil {
		mt := c.manual.newTimer(d, 0)
		return &Timer{C: mt.c, mt: mt}
	}
	rt := time.NewTimer(d)
	return &Timer{C: rt.C, rt: rt}
}

// Reset arms the timer d from now and reports whether it was armed.
func (t *Timer) Reset(d time.Duration) bool {
	if t.mt != nil {
		return t.mt.reset(d)
	}
	return t.rt.Reset(d)
}

// Stop disarms the timer and reports whether it was armed.
func (t *Timer) Stop() bool {
	if t.mt != nil {
		return t.mt.stop()
	}
	return t.rt.Stop()
}

// Ticker is a time.Ticker of a Clock.
type Ticker struct {
	C  <-chan time.Time
	rt *time.Ticker
	mt *manualTimer
}

// NewTicker returns a ticker that delivers on C every d (d > 0) of c's
// local clock, dropping ticks a slow reader misses.
func (c *Clock) NewTicker(d time.Duration) *Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	if c.manual != nil {
		mt := c.manual.newTimer(d, d)
		return &Ticker{C: mt.c, mt: mt}
	}
	rt := time.NewTicker(d)
	return &Ticker{C: rt.C, rt: rt}
}

// Stop turns the ticker off.
func (t *Ticker) Stop() {
	if t.mt != nil {
		t.mt.stop()
		return
	}
	t.rt.Stop()
}
