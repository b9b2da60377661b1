package scheduler_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestPassRunsWhileChangesFlow: changes of the projection reach the loop
// many a second (another entry edited over and over). Taking one must not
// push the loop's next pass back, or a replica whose own entries are hours
// away would not run a pass (its stats, shards and gauges frozen, its
// leases not renewed) for as long as they flow.
func TestPassRunsWhileChangesFlow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("hourly-a", "@every 1h"), every("hourly-b", "@every 1h"), every("edited", "@every 1h"))
	n := e.startNode("r1", nodeOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return n.counts().Entries == 3 }, "three entries known")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // edits of an entry, one every 50 ms
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = e.client.Put(ctx, every("edited", "@every 1h", func(en *events.Entry) { en.Note = strconv.Itoa(i) }))
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	if _, err := e.client.Remove(ctx, "hourly-b"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return n.counts().Entries == 2 },
		"no pass counted the removal while changes flowed (entries %d)", n.counts().Entries)
}
