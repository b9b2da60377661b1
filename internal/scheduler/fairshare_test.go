package scheduler

import (
	"fmt"
	"testing"
)

// A pass over its budget leaves the rest in the backlog: every due entry
// is fired by one of the passes that follow, once, whatever the queues.
func TestFairShareLosesNothing(t *testing.T) {
	for _, tc := range []struct{ queues, perQueue, batch, parallel int }{
		{8, 50, 10, 4}, {3, 5, 2, 2}, {1, 100, 7, 3}, {5, 1, 1, 1}, {8, 1000, 1000, 4},
	} {
		t.Run(fmt.Sprintf("%dx%d/%dx%d", tc.queues, tc.perQueue, tc.batch, tc.parallel), func(t *testing.T) {
			s := &Scheduler{cfg: Config{Batch: tc.batch, Parallel: tc.parallel}, entries: map[string]*entryRun{}}
			var due []*entryRun
			for q := range tc.queues {
				for i := range tc.perQueue {
					r := &entryRun{id: fmt.Sprintf("q%d-%d", q, i), queue: fmt.Sprintf("q%d", q), index: -1, state: stateReady}
					s.entries[r.id] = r
					due = append(due, r)
				}
			}
			budget := tc.batch * tc.parallel
			fired := map[string]int{}
			total := len(due)
			for pass := 0; pass == 0 || len(s.backlog) > 0; pass++ {
				if pass > total {
					t.Fatalf("backlog never drains: %d queues left", len(s.backlog))
				}
				got := s.fairShare(due)
				due = nil
				if len(got) > budget {
					t.Fatalf("pass %d took %d entries, over the budget of %d", pass, len(got), budget)
				}
				for _, r := range got {
					fired[r.id]++
				}
			}
			for id := range s.entries {
				if fired[id] != 1 {
					t.Errorf("entry %s taken %d times, want once", id, fired[id])
				}
			}
		})
	}
}
