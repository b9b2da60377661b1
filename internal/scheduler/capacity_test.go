package scheduler

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
)

// The capacity a replica shows: unknown until a window held enough fires,
// then the best window's fires per second of busy time, forgotten after
// the horizon.
func TestCapacityMeter(t *testing.T) {
	m := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := clock.New(nil, clock.Options{Manual: m})
	// The process's CPU time is not known here: busy time alone counts.
	meter := capacityMeter{processCPU: func() (time.Duration, bool) { return 0, false }}
	pass := func(fires int, busy time.Duration) {
		meter.begin(c)
		m.Advance(busy)
		meter.add(c.Mono(), fires, busy)
	}
	if _, ok := meter.capacity(c); ok {
		t.Fatal("a replica that never fired shows a capacity")
	}
	// Too few fires in a window: nothing shown.
	for range 9 {
		pass(10, time.Millisecond)
		m.Advance(time.Second)
	}
	m.Advance(capacityWindow)
	if got, ok := meter.capacity(c); ok {
		t.Fatalf("90 fires in a window show a capacity of %.0f/s", got.PerSecond)
	}
	// 500 fires in 100 ms of passes over 10 s: 5,000 a second while firing.
	for range 5 {
		pass(100, 20*time.Millisecond)
		m.Advance(2 * time.Second)
	}
	m.Advance(capacityWindow)
	got, ok := meter.capacity(c)
	if !ok || got.PerSecond < 4999 || got.PerSecond > 5001 || got.Fires != 500 {
		t.Fatalf("capacity %+v %v, want 5,000/s from 500 fires", got, ok)
	}
	// A slower window later does not lower what was shown; a faster one
	// raises it.
	pass(200, 100*time.Millisecond)
	m.Advance(capacityWindow)
	if got, _ := meter.capacity(c); got.PerSecond < 4999 || got.PerSecond > 5001 {
		t.Errorf("after a slower window: %.0f/s, want the best, 5,000", got.PerSecond)
	}
	pass(1000, 100*time.Millisecond)
	m.Advance(capacityWindow)
	if got, _ := meter.capacity(c); got.PerSecond < 9999 || got.PerSecond > 10001 {
		t.Errorf("after a faster window: %.0f/s, want 10,000", got.PerSecond)
	}
	// An hour later, nothing shown lately: unknown again.
	m.Advance(capacityHorizon)
	if got, ok := meter.capacity(c); ok {
		t.Errorf("an hour after the last window: %.0f/s shown, want unknown", got.PerSecond)
	}
}

// A replica whose process spends its CPU beside the fire passes (the
// relay, the projection) shows what its CPU allows, not what its passes'
// speed alone would: the lesser of the two rates, never less than what
// it fired.
func TestCapacityMeterCountsTheProcessCPU(t *testing.T) {
	m := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := clock.New(nil, clock.Options{Manual: m})
	var used time.Duration
	meter := capacityMeter{processCPU: func() (time.Duration, bool) { return used, true }, cores: 0.1}
	// Ten passes a second for 10 s, 500 fires each in 25 ms: 20,000 a
	// second of pass time. The process spends 9 ms of CPU a pass, 90 ms
	// of its 100 ms a second: 50,000 fires in 9 s of its tenth of a core
	// are 5,555 a second with all of it.
	for range 100 {
		meter.begin(c)
		m.Advance(25 * time.Millisecond)
		used += 9 * time.Millisecond
		meter.add(c.Mono(), 500, 25*time.Millisecond)
		m.Advance(75 * time.Millisecond)
	}
	m.Advance(capacityWindow)
	got, ok := meter.capacity(c)
	if want := 50000 / 9.0; !ok || got.PerSecond < want-1 || got.PerSecond > want+1 {
		t.Fatalf("capacity %+v %v, want %.0f/s (the CPU's bound)", got, ok, want)
	}
	if got.CPU != 900*time.Millisecond || got.Cores != 0.1 {
		t.Errorf("window CPU %s over %v cores, want 900ms over 0.1", got.CPU, got.Cores)
	}
	// One burst a minute, one pass a window: the pass's own CPU counts.
	meter = capacityMeter{processCPU: func() (time.Duration, bool) { return used, true }, cores: 1}
	meter.begin(c)
	m.Advance(2 * time.Second)
	used += 2 * time.Second
	meter.add(c.Mono(), 10000, 2*time.Second)
	m.Advance(time.Minute)
	if got, _ := meter.capacity(c); got.PerSecond < 4999 || got.PerSecond > 5001 || got.CPU != 2*time.Second {
		t.Errorf("capacity %+v after one burst, want 5,000/s over its 2 s of CPU", got)
	}
	// Slow passes with CPU to spare: the passes' speed is the bound.
	meter = capacityMeter{processCPU: func() (time.Duration, bool) { return used, true }, cores: 2}
	for range 11 {
		meter.begin(c)
		m.Advance(500 * time.Millisecond)
		used += time.Millisecond
		meter.add(c.Mono(), 100, 500*time.Millisecond)
		m.Advance(500 * time.Millisecond)
	}
	m.Advance(capacityWindow)
	if got, _ := meter.capacity(c); got.PerSecond < 199 || got.PerSecond > 201 {
		t.Errorf("capacity %+v, want 200/s (the passes' bound)", got)
	}
}
