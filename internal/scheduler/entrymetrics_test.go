package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// timesScheduler is a scheduler of replica id holding the runs of the
// entries of the shards whose index is owned mod 3 of n entries (and n/10
// paused ones), as if it owned those shards, built without running, for
// listEntryTimes.
func timesScheduler(tb testing.TB, id string, owned, n int) *Scheduler {
	tb.Helper()
	en := events.Entry{ID: "x", Cron: "@every 10s", Task: events.Task{Type: "x"}}
	sched, err := schedule.NewSchedule(en)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Scheduler{cfg: Config{ReplicaID: id}, entries: map[string]*entryRun{}}
	cursor := time.Unix(1_800_000_000, 0)
	for i := range n {
		eid := fmt.Sprintf("e%06d", i)
		if events.ShardOf(eid)%3 != owned {
			continue
		}
		s.entries[eid] = &entryRun{id: eid, st: projector.State{Entry: en}, sched: sched, queue: "default",
			cursor: cursor, hasCursor: true, state: stateReady, index: -1}
	}
	for i := range n / 10 {
		eid := fmt.Sprintf("p%06d", i)
		if events.ShardOf(eid)%3 != owned {
			continue
		}
		p := en
		p.Paused = true
		s.entries[eid] = &entryRun{id: eid, st: projector.State{Entry: p}, queue: "default", state: stateKnown, index: -1}
	}
	return s
}

// TestListEntryTimesPartition: replicas owning disjoint shards list every
// entry, paused ones included, exactly once between them (each the
// entries of its own shards); a paused entry has no next fire.
func TestListEntryTimesPartition(t *testing.T) {
	live := []string{"r1", "r2", "r3"}
	seen := map[string]string{}
	for i, id := range live {
		for _, e := range timesScheduler(t, id, i, 1000).listEntryTimes() {
			if other, ok := seen[e.id]; ok {
				t.Fatalf("entry %s listed by %s and %s", e.id, other, id)
			}
			seen[e.id] = id
			if paused := e.id[0] == 'p'; paused != e.next.IsZero() || paused != e.last.IsZero() {
				t.Errorf("entry %s: last %s next %s", e.id, e.last, e.next)
			}
		}
	}
	if len(seen) != 1100 {
		t.Fatalf("%d entries listed, want 1100", len(seen))
	}
}

// BenchmarkListEntryTimes100k: one scrape's pass of the loop over the
// entries a replica owns of 100,000, with three replicas.
func BenchmarkListEntryTimes100k(b *testing.B) {
	s := timesScheduler(b, "r1", 0, 100_000)
	b.ResetTimer()
	for b.Loop() {
		s.listEntryTimes()
	}
}
