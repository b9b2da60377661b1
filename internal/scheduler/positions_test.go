package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
)

// TestPositions: a run's position is noted in place fire after fire, kept
// for keptPosition after its shard left, dropped then or when forgotten,
// and a run (or a new run of the entry) notes afresh after a drop.
func TestPositions(t *testing.T) {
	m := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	p := positions{now: clock.New(nil, clock.Options{Manual: m}).Now}
	tick := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &entryRun{id: "e1", queue: "q1", handled: tick, hasHandled: true}
	want := func(what string, ok bool, at time.Time) {
		t.Helper()
		pos, found := p.get("e1")
		if found != ok || (ok && (!pos.tick.Equal(at) || pos.queue != "q1")) {
			t.Fatalf("%s: position %+v (found %v), want found %v at %s", what, pos, found, ok, at)
		}
	}
	p.note(r, 0)
	want("first note", true, tick)
	first := r.pos
	r.handled = tick.Add(time.Second)
	p.note(r, 0)
	want("second note", true, tick.Add(time.Second))
	if r.pos != first {
		t.Fatal("the second note replaced the position instead of updating it")
	}
	if q := p.queues(); len(q) != 1 || q[0] != "q1" {
		t.Fatalf("queues = %v, want [q1]", q)
	}

	p.keep("e1")
	m.Advance(keptPosition - time.Second)
	want("kept", true, tick.Add(time.Second))
	m.Advance(2 * time.Second)
	if q := p.queues(); len(q) != 0 { // prunes
		t.Fatalf("queues after the kept time = %v, want none", q)
	}
	want("kept past its time", false, time.Time{})

	// The shard comes back: the run notes afresh.
	r.handled = tick.Add(5 * time.Second)
	p.note(r, 0)
	want("noted after the drop", true, tick.Add(5*time.Second))

	p.forget("e1")
	want("forgotten", false, time.Time{})
	again := &entryRun{id: "e1", queue: "q1", handled: tick.Add(9 * time.Second), hasHandled: true}
	p.note(again, 0)
	p.note(r, 0) // the old run's pointer is dropped: it notes afresh and wins
	want("old run after the new one", true, tick.Add(5*time.Second))
	if !again.pos.dropped {
		t.Fatal("the new run's position was not dropped when the old run noted over it")
	}
}

// TestPositionsQueues: queues follows the positions as they are noted,
// move queue, are kept, taken back, forgotten and pruned.
func TestPositionsQueues(t *testing.T) {
	m := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	p := positions{now: clock.New(nil, clock.Options{Manual: m}).Now}
	tick := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	run := func(id, q string) *entryRun {
		return &entryRun{id: id, queue: q, handled: tick, hasHandled: true}
	}
	want := func(what string, queues ...string) {
		t.Helper()
		got := p.queues()
		slices.Sort(got)
		if !slices.Equal(got, queues) {
			t.Fatalf("%s: queues = %v, want %v", what, got, queues)
		}
	}
	a, b, c := run("a", "q1"), run("b", "q1"), run("c", "q2")
	for _, r := range []*entryRun{a, b, c} {
		p.note(r, 3)
	}
	want("three noted", "q1", "q2")
	c.queue = "q3"
	p.note(c, 3)
	want("c moved to q3", "q1", "q3")
	p.forget("a")
	want("a forgotten", "q1", "q3")
	p.keep("b")
	p.note(b, 3) // its shard came back before the kept time was over
	m.Advance(2 * keptPosition)
	want("b taken back", "q1", "q3")
	p.keep("c")
	m.Advance(keptPosition + time.Second)
	want("c kept past its time", "q1")
	p.forget("b")
	want("all gone")
	if p.kept != 0 || len(p.m) != 0 {
		t.Fatalf("%d kept and %d positions left, want none", p.kept, len(p.m))
	}
}
