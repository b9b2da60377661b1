package scheduler

import (
	"sync"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
)

// What a replica has shown it can fire (docs/design.md "Capacity"): the
// fires of its passes over the time those passes took, in windows of
// capacityWindow, the best window of the last capacityHorizon counting.
// A pass's time is the replica's work and Redis's answer together, so a
// rate of busy time is what the replica fires per second while it fires:
// its capacity if it fired all the time. A window of fewer than
// capacityMinFires fires says nothing (its passes are too few to time),
// and a replica with no such window in the horizon has shown nothing: its
// capacity is unknown, never guessed.
const (
	capacityWindow   = 10 * time.Second
	capacityHorizon  = time.Hour
	capacityMinFires = 100
)

// Capacity is what a replica has shown it can fire.
type Capacity struct {
	// PerSecond is the best fires per second of busy fire-pass time over
	// the windows of the last hour that held enough fires to tell.
	PerSecond float64
	// Fires and Busy are that window's; Age is how long ago it ended.
	Fires int
	Busy  time.Duration
	Age   time.Duration
}

// capacityMeter measures Capacity from the passes' fires and times. The
// loop adds; anyone reads.
type capacityMeter struct {
	mu      sync.Mutex
	start   clock.Mono // of the open window (zero: none open)
	fires   int
	busy    time.Duration
	windows []capacitySample // closed windows with enough fires, oldest first
}

type capacitySample struct {
	end   clock.Mono
	fires int
	busy  time.Duration
}

func (s capacitySample) rate() float64 { return float64(s.fires) / s.busy.Seconds() }

// add counts one pass that ended at now: fires sent that got an answer,
// in busy.
func (m *capacityMeter) add(now clock.Mono, fires int, busy time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closeLocked(now)
	if m.start.IsZero() {
		m.start = now.Add(-busy)
	}
	m.fires += fires
	m.busy += busy
}

// closeLocked ends the open window once it has lasted capacityWindow,
// keeping it when it held enough fires, and forgets windows older than
// the horizon.
func (m *capacityMeter) closeLocked(now clock.Mono) {
	if !m.start.IsZero() && !now.Before(m.start.Add(capacityWindow)) {
		if m.fires >= capacityMinFires && m.busy > 0 {
			m.windows = append(m.windows, capacitySample{end: now, fires: m.fires, busy: m.busy})
		}
		m.start, m.fires, m.busy = clock.Mono{}, 0, 0
	}
	i := 0
	for i < len(m.windows) && !now.Before(m.windows[i].end.Add(capacityHorizon)) {
		i++
	}
	m.windows = m.windows[i:]
}

// capacity returns the best window of the horizon, and false when there
// is none.
func (m *capacityMeter) capacity(c *clock.Clock) (Capacity, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closeLocked(c.Mono())
	var best *capacitySample
	for i := range m.windows {
		if w := &m.windows[i]; best == nil || w.rate() > best.rate() {
			best = w
		}
	}
	if best == nil {
		return Capacity{}, false
	}
	return Capacity{PerSecond: best.rate(), Fires: best.fires, Busy: best.busy, Age: c.Since(best.end)}, true
}

// Capacity returns what this replica has shown it can fire, and false
// while it has shown nothing (it fired too little in the last hour to
// tell). Safe from any goroutine.
func (s *Scheduler) Capacity() (Capacity, bool) { return s.capacity.capacity(s.clock) }
