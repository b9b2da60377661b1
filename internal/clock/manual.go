package clock

import (
	"sync"
	"time"
)

// Manual is a local clock that moves only when told to (Advance,
// AdvanceTo), with the timers and tickers of the Clocks built on it
// (Options.Manual). It lets a test or a simulation run the real
// scheduler and ownership loops through minutes of time in moments, and
// know when they are done with an instant: a timer that fired counts as
// outstanding until its owner Resets or Stops it (the loops do so before
// they wait again), so Outstanding reaching zero says every timer's owner
// has acted on it. Tickers never count. Safe for concurrent use.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	armed  map[*manualTimer]struct{}
	unseen int // timers fired and not Reset or Stopped since
}

// NewManual returns a manual clock reading start.
func NewManual(start time.Time) *Manual {
	return &Manual{now: start, armed: map[*manualTimer]struct{}{}}
}

// Now reads the manual clock.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock d ahead (AdvanceTo).
func (m *Manual) Advance(d time.Duration) { m.AdvanceTo(m.Now().Add(d)) }

// AdvanceTo moves the clock to t (never back) and fires, in deadline
// order, every timer and ticker due by then: each receives its deadline,
// and a ticker that fell behind by several periods receives one value, as
// time.Ticker drops the ticks a slow reader misses.
func (m *Manual) AdvanceTo(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.After(m.now) {
		m.now = t
	}
	for {
		var first *manualTimer
		for mt := range m.armed {
			if !mt.when.After(m.now) && (first == nil || mt.when.Before(first.when)) {
				first = mt
			}
		}
		if first == nil {
			return
		}
		select {
		case first.c <- first.when:
		default: // a ticker whose reader is behind
		}
		if first.period > 0 {
			for !first.when.After(m.now) {
				first.when = first.when.Add(first.period)
			}
			continue
		}
		delete(m.armed, first)
		first.fired = true
		m.unseen++
	}
}

// Next returns the earliest deadline of the armed timers and tickers, and
// false when none is armed.
func (m *Manual) Next() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var next time.Time
	for mt := range m.armed {
		if next.IsZero() || mt.when.Before(next) {
			next = mt.when
		}
	}
	return next, !next.IsZero()
}

// Outstanding counts the timers that fired and have not been Reset or
// Stopped since: their owners have not yet acted on them.
func (m *Manual) Outstanding() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unseen
}

// manualTimer is a Timer (period 0) or Ticker of a Manual clock.
type manualTimer struct {
	m      *Manual
	c      chan time.Time
	when   time.Time
	period time.Duration
	fired  bool // a timer that fired and was not Reset or Stopped since
}

func (m *Manual) newTimer(d, period time.Duration) *manualTimer {
	mt := &manualTimer{m: m, c: make(chan time.Time, 1), period: period}
	mt.reset(d)
	return mt
}

// reset arms mt d from now (a timer due at once fires at the next
// AdvanceTo, which a test calls with the clock's own time) and drops a
// value it delivered that was not received, as time.Timer does since Go
// 1.23. It reports whether mt was armed.
func (mt *manualTimer) reset(d time.Duration) bool {
	m := mt.m
	m.mu.Lock()
	defer m.mu.Unlock()
	wasArmed := mt.disarmLocked()
	mt.when = m.now.Add(d)
	m.armed[mt] = struct{}{}
	if d <= 0 && mt.period == 0 {
		// Due now: delivered at once, as a real timer would be.
		delete(m.armed, mt)
		mt.c <- mt.when
		mt.fired = true
		m.unseen++
	}
	return wasArmed
}

// stop disarms mt and reports whether it was armed.
func (mt *manualTimer) stop() bool {
	mt.m.mu.Lock()
	defer mt.m.mu.Unlock()
	return mt.disarmLocked()
}

func (mt *manualTimer) disarmLocked() bool {
	m := mt.m
	_, wasArmed := m.armed[mt]
	delete(m.armed, mt)
	if mt.fired {
		mt.fired = false
		m.unseen--
	}
	select {
	case <-mt.c:
	default:
	}
	return wasArmed
}
