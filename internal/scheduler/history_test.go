package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestStreamHistory: event counts for every entry in one request, and the
// queues of an entry's current life.
func TestStreamHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("one", "@every 1m", inQueue("a")))
	e.put(every("moved", "@every 1m", inQueue("a")))
	e.put(every("moved", "@every 1m", inQueue("b")))
	e.put(every("moved", "@every 2m", inQueue("b")))
	e.put(every("reborn", "@every 1m", inQueue("a")))
	if _, err := e.client.Remove(testenv.Context(t, 5*time.Second), "reborn"); err != nil {
		t.Fatal(err)
	}
	last := e.put(every("reborn", "@every 1m", inQueue("c")))
	h := scheduler.NewStreamHistory(e.js, testNames)
	c := testenv.Context(t, 10*time.Second)
	counts, asOf, err := h.EventCounts(c)
	if err != nil {
		t.Fatal(err)
	}
	if asOf < last || counts["one"] != 1 || counts["moved"] != 3 || counts["reborn"] != 3 {
		t.Fatalf("counts %v as of %d (last %d)", counts, asOf, last)
	}
	for id, want := range map[string][]string{"one": {"a"}, "moved": {"a", "b"}, "reborn": {"c"}} {
		got, err := h.PreviousQueues(c, id)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("PreviousQueues(%s) = %v, %v; want %v", id, got, err, want)
		}
	}
}

// TestStopSince: when a paused entry's pause began (its first paused
// state, however often it was edited since) and when the schedule it
// stopped began (its last spec change before the pause; a registration
// made paused has none); for a removed entry, its removal and the schedule
// it stopped, or the pause it was in when removed; nothing for an entry
// that runs, or that was removed and registered again. And the start of
// an entry's current schedule, with the stop it restarted after.
func TestStopSince(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// One deadline for the whole test, which makes some thirty config
	// changes and reads: beside the rest of the suite they take seconds.
	c := testenv.Context(t, 30*time.Second)
	e.put(every("p", "@every 1m"))
	e.put(every("p", "@every 2m"))
	e.put(every("p", "@every 2m", withPayload("x")))
	e.pauseOf("p", "first")
	e.pauseOf("p", "second")
	e.put(every("born-paused", "@every 1m", func(en *events.Entry) { en.Paused = true }))
	e.put(every("resumed", "@every 1m"))
	e.pauseOf("resumed", "")
	e.resume("resumed")
	e.put(every("gone", "@every 1m"))
	e.put(every("gone", "@every 2m"))
	e.removeOf("gone")
	e.put(every("paused-gone", "@every 1m"))
	e.pauseOf("paused-gone", "")
	e.removeOf("paused-gone")
	e.put(every("reborn", "@every 1m"))
	e.removeOf("reborn")
	e.put(every("reborn", "@every 1m"))
	e.put(every("reborn-paused", "@every 1m"))
	e.removeOf("reborn-paused")
	e.put(every("reborn-paused", "@every 5m", func(en *events.Entry) { en.Paused = true }))
	h := scheduler.NewStreamHistory(e.js, testNames)
	p, born, gone, pg := e.configTimes("p"), e.configTimes("born-paused"), e.configTimes("gone"), e.configTimes("paused-gone")
	rp := e.configTimes("reborn-paused")
	seq := func(id string, i int) uint64 {
		t.Helper()
		recs, err := e.client.History(c, id)
		if err != nil || len(recs) <= i {
			t.Fatalf("history of %s: %d records, %v", id, len(recs), err)
		}
		return recs[i].Seq
	}
	for id, want := range map[string]scheduler.StopSpan{
		"p":           {Stopped: p[3], Since: p[1], Revision: seq("p", 3), From: &events.Entry{Cron: "@every 2m"}},
		"born-paused": {Stopped: born[0], Since: born[0], Revision: seq("born-paused", 0)},
		"gone":        {Stopped: gone[2], Since: gone[1], Removed: true, Revision: seq("gone", 2), From: &events.Entry{Cron: "@every 2m"}},
		// Removed while paused: the pause is what stopped it.
		"paused-gone": {Stopped: pg[1], Since: pg[0], Revision: seq("paused-gone", 1), From: &events.Entry{Cron: "@every 1m"}},
		// Registered paused right after its removal: nothing ran since
		// the removal, which is what stopped it.
		"reborn-paused": {Stopped: rp[1], Since: rp[0], Removed: true, Revision: seq("reborn-paused", 1), From: &events.Entry{Cron: "@every 1m"}},
	} {
		got, ok, err := h.StopSince(c, id, 0)
		if err != nil || !ok || !sameSpan(got, want) {
			t.Errorf("StopSince(%s) = %+v, %v, %v; want %+v", id, got, ok, err, want)
		}
	}
	for _, id := range []string{"resumed", "reborn"} {
		if got, ok, err := h.StopSince(c, id, 0); err != nil || ok {
			t.Errorf("StopSince(%s) = %+v, %v, %v; want neither paused nor removed", id, got, ok, err)
		}
	}
	// As of its removal, reborn was removed: what came after is not read.
	reborn := e.configTimes("reborn")
	if got, ok, err := h.StopSince(c, "reborn", seq("reborn", 1)); err != nil || !ok || !sameSpan(got, scheduler.StopSpan{Stopped: reborn[1], Since: reborn[0], Removed: true, Revision: seq("reborn", 1), From: &events.Entry{Cron: "@every 1m"}}) {
		t.Errorf("StopSince(reborn, as of its removal) = %+v, %v, %v", got, ok, err)
	}

	// The schedule a resume or a registration after a removal starts
	// names the stop before it and the entry as it ran then; a schedule
	// begun by a spec change, and a paused entry's, name none.
	resumed := e.configTimes("resumed")
	e.put(every("respecced", "@every 1m"))
	e.pauseOf("respecced", "")
	e.resume("respecced")
	e.put(every("respecced", "@every 5m"))
	respecced := e.configTimes("respecced")
	e.resume("reborn-paused")
	rp = e.configTimes("reborn-paused")
	for id, want := range map[string]scheduler.ScheduleStart{
		"resumed": {Since: resumed[2],
			Stop: scheduler.StopSpan{Stopped: resumed[1], Since: resumed[0], Revision: seq("resumed", 1), From: &events.Entry{Cron: "@every 1m"}}},
		"reborn": {Since: reborn[2],
			Stop: scheduler.StopSpan{Stopped: reborn[1], Since: reborn[0], Removed: true, Revision: seq("reborn", 1), From: &events.Entry{Cron: "@every 1m"}}},
		// Resumed after a registration made paused right after its
		// removal: it restarted after that removal.
		"reborn-paused": {Since: rp[3],
			Stop: scheduler.StopSpan{Stopped: rp[1], Since: rp[0], Removed: true, Revision: seq("reborn-paused", 1), From: &events.Entry{Cron: "@every 1m"}}},
		"respecced": {Since: respecced[3]},
		"p":         {Since: p[4]},
	} {
		got, ok, err := h.ScheduleStart(c, id)
		if err != nil || !ok || !got.Since.Equal(want.Since) || !sameSpan(got.Stop, want.Stop) {
			t.Errorf("ScheduleStart(%s) = %+v, %v, %v; want %+v", id, got, ok, err, want)
		}
	}
}

// sameSpan compares stop spans, their From by cron spec.
func sameSpan(got, want scheduler.StopSpan) bool {
	if (got.From == nil) != (want.From == nil) || (got.From != nil && got.From.Cron != want.From.Cron) {
		return false
	}
	return got.Stopped.Equal(want.Stopped) && got.Since.Equal(want.Since) && got.Removed == want.Removed && got.Revision == want.Revision
}

// TestNewEntriesNeedNoHistory: entries that never fired and whose subject
// holds only their registration are loaded without reading any history
// (one event-count request instead of a consumer per entry), and still
// fire; an entry with a queue change is closed in its old queue.
func TestNewEntriesNeedNoHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 30 {
		e.put(every(fmt.Sprintf("n%02d", i), "@every 1s"))
	}
	e.put(every("old", "@every 1s", inQueue("alpha")))
	e.put(every("old", "@every 1s", inQueue("beta")))
	h := &countingHistory{History: scheduler.NewStreamHistory(e.js, testNames)}
	a := e.startNode("a", nodeOpts{sched: func(c *scheduler.Config) { c.History = h }})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 31 }, "entries to fire")
	a.stop()
	if h.counts < 1 || h.previous != 1 {
		t.Fatalf("history asked %d times for counts and %d times for queues; want counts at least once and queues once (for old)", h.counts, h.previous)
	}
	res, err := e.store.FireBatch(testenv.Context(t, 5*time.Second), staleFences, []taskstate.Fire{staleFire(t, "old", "alpha", time.Now().Add(time.Hour).Truncate(time.Second))})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status.String() != "moved" {
		t.Fatalf("a stale fire into the old queue: %s, want moved", res[0].Status)
	}
}

type countingHistory struct {
	scheduler.History
	counts, previous int
}

func (h *countingHistory) EventCounts(ctx context.Context) (map[string]uint64, uint64, error) {
	h.counts++
	return h.History.EventCounts(ctx)
}

func (h *countingHistory) PreviousQueues(ctx context.Context, entry string) ([]string, error) {
	h.previous++
	return h.History.PreviousQueues(ctx, entry)
}

// BenchmarkHistory measures what the scheduler pays, per entry without a
// watermark, to learn its earlier queues: a consumer on its config history
// (PreviousQueues, what the replica wired before NewStreamHistory) against
// one event-count request for all entries.
func BenchmarkHistory(b *testing.B) {
	n := envInt("CRONSTREAM_BENCH_HISTORY_ENTRIES", 10_000)
	srv := testenv.StartNATS(b)
	_, js := benchConnect(b, srv.URL())
	if err := events.EnsureStreams(context.Background(), js, events.StreamConfig{Names: testNames}); err != nil {
		b.Fatal(err)
	}
	eventtest.Register(b, js, testNames, "bench", entriesOf(n, func(i int) events.Entry { return every(fmt.Sprintf("h%05d", i), "@every 1m") }), 30*time.Second)
	h := scheduler.NewStreamHistory(js, testNames)
	c := context.Background()
	b.Run("PreviousQueues-per-entry", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if _, err := h.PreviousQueues(c, fmt.Sprintf("h%05d", i%n)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("EventCounts-all-entries", func(b *testing.B) {
		for b.Loop() {
			counts, _, err := h.EventCounts(c)
			if err != nil || len(counts) != n {
				b.Fatalf("%d counts, %v", len(counts), err)
			}
		}
	})
}

// TestLostWatermarkRestored: Redis loses its data (FLUSHALL) after an entry
// with catch-up "all" fired for a while. The replica that starts next finds
// no watermark but the entry's fires in the stream: it seeds the watermark
// from the last one, so no tick that already fired is enqueued again.
func TestLostWatermarkRestored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("w", "@every 1s", withCatchup(events.CatchupAll, time.Hour)))
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 4 }, "a to fire")
	a.stop()
	e.waitOutboxEmpty(5*time.Second, "default")
	_, lastBefore := ledgers(e.readActivity())["w"].firedRange()
	if err := e.rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return b.counts().Fired >= 3 }, "b to fire after the loss")
	b.stop()
	for _, id := range e.pendingIDs("default") {
		tick, err := time.Parse(time.RFC3339, id[len(testPrefix+":w:"):])
		if err != nil {
			t.Fatal(err)
		}
		if tick.Unix() <= lastBefore {
			t.Errorf("tick %s fired again after the data loss (last fired before: %s)", tick.Format(time.TimeOnly), fmtUnix(lastBefore))
		}
	}
	e.waitOutboxEmpty(5*time.Second, "default")
	l := ledgers(e.readActivity())["w"]
	first, last := l.firedRange()
	checkEverySecond(t, "w", l, first, last)
}
