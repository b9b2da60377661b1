package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

// TestCheckAcrossDataLoss feeds the final check one entry's history across
// a Redis data loss: what a healthy restore leaves passes, with the record
// the relay had not published counted as lost with Redis; each way of
// firing a tick again across the loss is a duplicate.
func TestCheckAcrossDataLoss(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tick := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	taskID := func(i int) string { return fmt.Sprintf("%s:e000:%s", prefix, tick(i).Format(time.RFC3339)) }
	fire := func(i int, enqueued time.Time) activity {
		return activity{msgID: fmt.Sprintf("fire:e000:%d", tick(i).Unix()), fired: &events.Fired{
			Entry: "e000", ScheduledAt: tick(i), EnqueuedAt: enqueued, TaskID: taskID(i), Queue: "q0", Replica: "r0",
		}}
	}
	stored := func(a activity, s time.Time) activity { a.stored = s; return a }
	lost, back := at(5.5), at(7.5)

	// Ticks 0-4 fired and published before the loss (4 while Redis was
	// stopping, from a record in the outbox); 5's record was in the outbox
	// and never published; 6-7 fell while Redis was down and were skipped;
	// 8-9 fired after it came back.
	until := tick(7)
	skip := activity{msgID: "skip:e000:6", stored: at(8.1), skipped: &events.Skipped{Entry: "e000", ScheduledAt: tick(6), Until: &until, Reason: events.SkipMissed}}
	var acts []activity
	for i := range 4 {
		acts = append(acts, stored(fire(i, tick(i)), tick(i).Add(100*time.Millisecond)))
	}
	acts = append(acts, stored(fire(4, tick(4)), at(5.6)), skip,
		stored(fire(8, tick(8)), tick(8).Add(100*time.Millisecond)), stored(fire(9, tick(9)), tick(9).Add(100*time.Millisecond)))
	healthy := checkInput{
		entries: []string{"e000"}, entryQueue: map[string]string{"e000": "q0"}, end: tick(9),
		bands:   []band{{from: lost.Add(-bandBefore), to: back.Add(bandAfter), why: "redis lost its data"}},
		snap:    snapWith(taskID(8), taskID(9)),
		acts:    acts,
		execs:   []execution{{id: taskID(2), pid: 1, ended: true}, {id: taskID(5), pid: 1, ended: true}, {id: taskID(8), pid: 1, ended: true}},
		flushes: []flush{{lost: lost, back: back, outbox: []activity{fire(4, tick(4)), fire(5, tick(5))}}},
	}
	r := check(context.Background(), nil, healthy)
	if r.duplicates() != 0 || r.lost() != 0 || r.missedOutside != 0 || r.neverFired != 0 || r.early != 0 {
		t.Fatalf("a healthy restore fails the check:\n%s", r.String())
	}
	if r.lostFired != 1 || r.ticksLostWithRedis != 1 || r.lostWithRedis() != 1 || r.firedFlushed != 5 || r.executedFlushed != 2 || r.tasksInRange != 8 {
		t.Fatalf("lost with Redis %d (fired %d, ticks %d), fired events whose task was flushed %d, flushed executions %d, handled ticks %d; want 1, 1, 1, 5, 2, 8:\n%s",
			r.lostWithRedis(), r.lostFired, r.ticksLostWithRedis, r.firedFlushed, r.executedFlushed, r.tasksInRange, r.String())
	}

	for _, c := range []struct {
		name   string
		change func(in *checkInput)
		count  func(r report) int
	}{
		{"a published tick fired again after the loss", func(in *checkInput) {
			// The stream dropped the second publish: only the task shows it.
			in.snap = snapWith(taskID(3), taskID(8), taskID(9))
		}, func(r report) int { return r.dupAfterLoss }},
		{"the tick of a lost record fired again", func(in *checkInput) {
			in.snap = snapWith(taskID(5), taskID(8), taskID(9))
			in.acts = append(in.acts, stored(fire(5, at(8.2)), at(8.3)))
		}, func(r report) int { return r.dupLostRecordRefired }},
		{"a flushed tick skipped after the loss", func(in *checkInput) {
			u := tick(2)
			in.acts = append(in.acts, activity{msgID: "skip:e000:2", stored: at(8.4), skipped: &events.Skipped{Entry: "e000", ScheduledAt: tick(2), Until: &u, Reason: events.SkipMissed}})
		}, func(r report) int { return r.skippedAndFired }},
		{"a flushed task run again", func(in *checkInput) {
			in.execs = append(in.execs, execution{id: taskID(2), pid: 2, ended: true})
		}, func(r report) int { return r.reexecSameAttempt }},
	} {
		in := healthy
		in.acts = append([]activity(nil), healthy.acts...)
		in.execs = append([]execution(nil), healthy.execs...)
		c.change(&in)
		r := check(context.Background(), nil, in)
		if c.count(r) != 1 || r.duplicates() != 1 {
			t.Errorf("%s: counted %d, duplicates %d; want 1 and 1:\n%s", c.name, c.count(r), r.duplicates(), r.String())
		}
	}

	// After the loss a fired event needs its task again, and a tick with
	// no trace is missed, not lost with Redis.
	in := healthy
	in.snap = snapWith(taskID(9))
	in.flushes = []flush{{lost: lost, back: back, outbox: []activity{fire(4, tick(4))}}}
	r = check(context.Background(), nil, in)
	if r.phantomEvents != 1 || r.unaccounted != 1 || r.lostWithRedis() != 0 {
		t.Errorf("fired event without task after the loss %d, unaccounted ticks %d, lost with Redis %d; want 1, 1, 0:\n%s", r.phantomEvents, r.unaccounted, r.lostWithRedis(), r.String())
	}
}

// snapWith is a Redis snapshot holding the given tasks, completed in q0.
func snapWith(ids ...string) redisSnapshot {
	s := redisSnapshot{places: map[string][]taskPlace{}, hashes: map[string][]string{}}
	for _, id := range ids {
		s.places[id] = []taskPlace{{"q0", "completed"}}
		s.hashes[id] = []string{"q0"}
	}
	return s
}

// TestLostWhileHeld: a task a killed worker held can have gone with a data
// loss that came after the kill, was under way at it (the worker ran its
// handlers on while Redis was down), or ended less than a handler's longest
// run before it; not with one that was over well before.
func TestLostWhileHeld(t *testing.T) {
	lost := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	flushes := []flush{{lost: lost, back: lost.Add(2 * time.Second)}}
	for _, c := range []struct {
		killed time.Duration // after lost
		want   bool
	}{
		{-time.Second, true},                    // before the loss
		{time.Second, true},                     // while Redis was down and empty
		{2*time.Second + workerMaxWork/2, true}, // a handler started before the loss may still run
		{2*time.Second + workerMaxWork + time.Second, false},
	} {
		if got := lostWhileHeld(flushes, lost.Add(c.killed)); got != c.want {
			t.Errorf("killed %s after the loss: lostWhileHeld %v, want %v", c.killed, got, c.want)
		}
	}
	if lostWhileHeld(nil, lost) {
		t.Error("lostWhileHeld without a data loss")
	}
}
