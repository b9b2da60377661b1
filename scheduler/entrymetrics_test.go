package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
)

type fixedMembers []string

func (m fixedMembers) Live() []string { return m }

// timesScheduler is a scheduler of replica id among live holding n known
// entries (and n/10 paused ones), built without running, for
// listEntryTimes.
func timesScheduler(tb testing.TB, id string, live []string, n int) *Scheduler {
	tb.Helper()
	en := events.Entry{ID: "x", Cron: "@every 10s", Task: events.Task{Type: "x"}}
	sched, err := NewSchedule(en)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Scheduler{cfg: Config{ReplicaID: id, Members: fixedMembers(live)}, entries: map[string]*entryRun{}, pausedEntries: map[string]projector.State{}}
	cursor := time.Unix(1_800_000_000, 0)
	for i := range n {
		eid := fmt.Sprintf("e%06d", i)
		s.entries[eid] = &entryRun{id: eid, st: projector.State{Entry: en}, sched: sched, queue: "default",
			cursor: cursor, hasCursor: true, phase: phaseReady, index: -1}
	}
	for i := range n / 10 {
		eid := fmt.Sprintf("p%06d", i)
		p := en
		p.Paused = true
		s.pausedEntries[eid] = projector.State{Entry: p}
	}
	return s
}

// TestListEntryTimesPartition: across the live replicas every entry,
// paused ones included, is listed by exactly one (its primary); a paused
// entry has no next fire.
func TestListEntryTimesPartition(t *testing.T) {
	live := []string{"r1", "r2", "r3"}
	seen := map[string]string{}
	for _, id := range live {
		for _, e := range timesScheduler(t, id, live, 1000).listEntryTimes() {
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

// BenchmarkListEntryTimes100k: one scrape's pass of the loop over 100,000
// entries with three live replicas.
func BenchmarkListEntryTimes100k(b *testing.B) {
	live := []string{"r1", "r2", "r3"}
	s := timesScheduler(b, "r1", live, 100_000)
	b.ResetTimer()
	for b.Loop() {
		s.listEntryTimes()
	}
}
