package scheduler_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestPassRunsWhileObservationsFlow: the other replicas' fires reach a
// replica as observations, many a second. Taking one must not push the
// loop's next pass back, or a replica whose own entries are hours away
// would not run a pass (its stats, membership view and gauges frozen) for
// as long as they flow.
func TestPassRunsWhileObservationsFlow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("hourly-a", "@every 1h"), every("hourly-b", "@every 1h"))
	n := e.startNode("r1", nodeOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return n.sched.Stats().Entries == 2 }, "two entries known")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // another replica's fires of an entry this one does not know
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				n.sched.Observe("elsewhere", now.Truncate(time.Second))
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	if _, err := e.client.Remove(ctx, "hourly-b"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return n.sched.Stats().Entries == 1 },
		"no pass counted the removal while observations flowed (entries %d)", n.sched.Stats().Entries)
}
