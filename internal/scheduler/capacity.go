package scheduler

import (
	"log/slog"
	"sync"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/proccpu"
)

// What a replica has shown it can fire (docs/design.md "Capacity"), in
// windows of capacityWindow, the best window of the last capacityHorizon
// counting. A window's rate is the lesser of two: its fires over the time
// its passes took (the replica's work and Redis's answers together: what
// it fires a second while it fires), and its fires over the CPU the whole
// process spent from its first pass's start to its last pass's end, as a
// share of the cores it may use (what it fires a second once its CPU is
// all used, the relay, the projection and the recoverer growing with it).
// The first alone counts only the firing loop, so a replica short of CPU
// showed more than it keeps up with; the second alone counts fixed work
// as if it grew with the fires. Both are at least what the window fired a
// second. A window of fewer than capacityMinFires fires says nothing (its
// passes are too few to time), and a replica with no such window in the
// horizon has shown nothing: its capacity is unknown, never guessed.
const (
	capacityWindow   = 10 * time.Second
	capacityHorizon  = time.Hour
	capacityMinFires = 100
)

// Capacity is what a replica has shown it can fire.
type Capacity struct {
	// PerSecond is the best rate over the windows of the last hour that
	// held enough fires to tell.
	PerSecond float64
	// Fires and Busy are that window's (its fires and the time its passes
	// took); CPU is the process's CPU time over the window, 0 where it
	// cannot be read; Cores is what the process may use. Age is how long
	// ago the window ended.
	Fires int
	Busy  time.Duration
	CPU   time.Duration
	Cores float64
	Age   time.Duration
}

// capacityMeter measures Capacity from the passes' fires and times and the
// process's CPU. The loop adds; anyone reads. The zero value reads the
// process's CPU with proccpu.
type capacityMeter struct {
	mu sync.Mutex
	// processCPU reads the process's CPU time so far, and cores is what
	// it may use (set on the first begin when nil).
	processCPU func() (time.Duration, bool)
	cores      float64
	log        *slog.Logger // each window closed, at debug (nil: none)

	passCPU  time.Duration // the process's CPU time when the last pass began
	passOK   bool
	start    clock.Mono // of the open window (zero: none open)
	fires    int
	busy     time.Duration
	startCPU time.Duration // the process's CPU time when the window's first pass began
	cpu      time.Duration // the process's CPU from startCPU to the last pass's end
	cpuOK    bool
	windows  []capacitySample // closed windows with enough fires, oldest first
}

type capacitySample struct {
	end   clock.Mono
	fires int
	busy  time.Duration
	cpu   time.Duration // 0: not known
	cores float64
}

func (s capacitySample) rate() float64 {
	r := float64(s.fires) / s.busy.Seconds()
	if s.cpu > 0 && s.cores > 0 {
		// The window's work done with all of the cores it may use.
		r = min(r, float64(s.fires)/(s.cpu.Seconds()/s.cores))
	}
	return r
}

// begin notes the process's CPU time as a pass begins, and returns when
// it begins on c.
func (m *capacityMeter) begin(c *clock.Clock) clock.Mono {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.processCPU == nil {
		m.processCPU, m.cores = proccpu.Used, proccpu.Cores()
	}
	m.passCPU, m.passOK = m.processCPU()
	return c.Mono()
}

// add counts one pass that ended at now, begun at the last begin: fires
// sent that got an answer, in busy.
func (m *capacityMeter) add(now clock.Mono, fires int, busy time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closeLocked(now)
	if m.start.IsZero() {
		m.start = now.Add(-busy)
		m.startCPU, m.cpuOK = m.passCPU, m.passOK
	}
	if m.cpuOK {
		used, ok := m.processCPU()
		m.cpu, m.cpuOK = used-m.startCPU, ok
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
			w := capacitySample{end: now, fires: m.fires, busy: m.busy, cores: m.cores}
			if m.cpuOK {
				w.cpu = m.cpu
			}
			m.windows = append(m.windows, w)
			if m.log != nil {
				m.log.Debug("capacity window", "fires", w.fires, "pass_time", w.busy, "cpu", w.cpu, "cores", w.cores, "per_second", int(w.rate()))
			}
		}
		m.start, m.fires, m.busy, m.cpu = clock.Mono{}, 0, 0, 0
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
	return Capacity{PerSecond: best.rate(), Fires: best.fires, Busy: best.busy, CPU: best.cpu, Cores: best.cores, Age: c.Since(best.end)}, true
}

// Capacity returns what this replica has shown it can fire, and false
// while it has shown nothing (it fired too little in the last hour to
// tell). Safe from any goroutine.
func (s *Scheduler) Capacity() (Capacity, bool) { return s.capacity.capacity(s.clock) }
