package testenv

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// Settle waits until the loops of a test on a manual clock (clock.Manual)
// have acted on the instant it reads, so the test can move the clock on.
// quiet reports that nothing is left for a loop to take: no timer waits
// for its owner, and whatever else the test's loops hand each other. idle
// waits, under ctx, until each loop has finished its turn and waits for its
// next event; quiet is asked again after it, since a turn can arm a timer.
// Settle polls far more often than Eventually, from a microsecond up to
// 100 µs, because a simulation settles at every instant it stops at. The
// test fails, with what() saying where the clock stood, when idle fails or
// nothing settled within timeout.
func Settle(t testing.TB, timeout time.Duration, quiet func() bool, idle func(ctx context.Context) error, what func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	pause := time.Microsecond
	for {
		if quiet() {
			if err := idle(ctx); err != nil {
				t.Fatalf("%s: did not settle: %v", what(), err)
			}
			if quiet() {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: did not settle within %s", what(), timeout)
		}
		runtime.Gosched()
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Microsecond)
	}
}
