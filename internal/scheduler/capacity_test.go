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
	var meter capacityMeter
	pass := func(fires int, busy time.Duration) {
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
