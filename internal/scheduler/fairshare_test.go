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

// An overloaded replica's backlog never drains: every pass adds as many
// entries as it takes. Each is still taken once, in the order it came due,
// and the backlog's storage stays bounded by what waits, not by what ever
// passed through it.
func TestFairShareBacklogThatNeverDrains(t *testing.T) {
	const budget, perPass, passes = 10, 10, 1000
	s := &Scheduler{cfg: Config{Batch: budget, Parallel: 1}, entries: map[string]*entryRun{}}
	next := 0
	add := func(n int) []*entryRun {
		var due []*entryRun
		for range n {
			r := &entryRun{id: fmt.Sprintf("e%06d", next), queue: "flood", index: -1, state: stateReady}
			next++
			s.entries[r.id] = r
			due = append(due, r)
		}
		return due
	}
	want := 0
	got := s.fairShare(add(3 * budget)) // a backlog of two passes' worth
	for pass := range passes {
		for _, r := range got {
			if r.id != fmt.Sprintf("e%06d", want) {
				t.Fatalf("pass %d took %s, want e%06d (oldest due first)", pass, r.id, want)
			}
			want++
		}
		got = s.fairShare(add(perPass))
	}
	b := s.backlog["flood"]
	if b == nil {
		t.Fatal("the backlog drained")
	}
	if waiting := len(b.runs) - b.head; waiting != 2*budget {
		t.Errorf("%d entries wait, want %d", waiting, 2*budget)
	}
	if cap(b.runs) > 8*budget {
		t.Errorf("the backlog's storage grew to %d for %d waiting entries", cap(b.runs), len(b.runs)-b.head)
	}
}
