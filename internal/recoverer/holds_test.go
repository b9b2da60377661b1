package recoverer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/recoverer"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestRecovererHoldsItsQueues: with ownership a recoverer recovers the
// queues whose duties its replica holds and leaves the others to their
// owners; a queue it takes over is recovered as soon as it is told, not
// an interval later.
func TestRecovererHoldsItsQueues(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedis(t).Client(t)
	expired := time.Now().Add(-time.Minute)
	seedActive(t, rc, "mine", []string{"m1", "m2"}, expired, nil)
	seedActive(t, rc, "theirs", []string{"t1"}, expired, nil)
	var mu sync.Mutex
	held := map[string]bool{"mine": true}
	changed := make(chan struct{}, 1)
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Interval: time.Hour, Changed: changed,
		Holds: func(q string) bool { mu.Lock(); defer mu.Unlock(); return held[q] }}, nil)
	passes := rec.Passes()
	_ = rec.Start(context.Background())
	t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	select {
	case res := <-passes:
		if res.Err != nil || res.Moved != 2 {
			t.Fatalf("first pass %+v, want mine's 2 tasks moved", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no first pass")
	}
	if st := rec.Stats(); st["theirs"].Retried != 0 || st["mine"].Retried != 2 {
		t.Fatalf("stats %+v: the queue it does not hold was recovered", st)
	}
	mu.Lock()
	held["theirs"] = true
	mu.Unlock()
	told := time.Now()
	changed <- struct{}{}
	testenv.Eventually(t, 10*time.Second, func() bool { return rec.Stats()["theirs"].Retried == 1 },
		"the queue taken over to be recovered")
	if d := time.Since(told); d > 5*time.Second {
		t.Errorf("recovered %s after the takeover, want at once (interval 1 h)", d)
	}
}
