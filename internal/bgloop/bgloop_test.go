package bgloop

import (
	"context"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type ctxKey struct{}

// TestLoopLifecycle: one run per Loop however often Start is called; the
// run keeps the start context's values, outlives its cancellation, and
// ends with Stop, which waits for it.
func TestLoopLifecycle(t *testing.T) {
	var l Loop
	var runs atomic.Int32
	ended := make(chan struct{})
	startCtx, cancelStart := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	run := func(ctx context.Context) {
		runs.Add(1)
		if ctx.Value(ctxKey{}) != "v" {
			t.Error("the loop's context lost the start context's values")
		}
		<-ctx.Done()
		close(ended)
	}
	l.Start(startCtx, run)
	l.Start(startCtx, run)
	cancelStart()
	select {
	case <-ended:
		t.Fatal("the loop ended with the start context")
	default:
	}
	l.Stop()
	select {
	case <-ended:
	default:
		t.Fatal("Stop returned before the loop ended")
	}
	l.Stop()
	l.Start(context.Background(), run)
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

// TestStopWithoutStart: Stop needs no Start, and a Start after it runs
// nothing.
func TestStopWithoutStart(t *testing.T) {
	var l Loop
	l.Stop()
	l.Start(context.Background(), func(context.Context) { t.Error("ran after Stop") })
}
