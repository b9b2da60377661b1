package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testenv"
)

func withCatchup(p events.CatchupPolicy, window time.Duration) func(*events.Entry) {
	return func(e *events.Entry) { e.Catchup = events.Catchup{Policy: p, Window: events.Duration(window)} }
}

// TestCatchupAfterOutage: a replica set fires, goes down, and comes back
// 12 s later by its clock (a manual one), with a 1.5 s grace: at least 10
// ticks were missed. Two replicas come back, without shard ownership, and
// race on the same gaps:
//
//   - none: one skipped event (reason missed) covers the gap, then ticks fire.
//   - latest: the most recent missed tick fires, one skipped event covers the
//     ticks before it.
//   - latest with a window shorter than the grace: nothing in the window, so
//     as none.
//   - all: every missed tick fires, oldest first, in passes of MaxCatchup.
//
// Either way every tick is handled exactly once.
func TestCatchupAfterOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(
		every("none", "@every 1s", withCatchup(events.CatchupNone, 0)),
		every("latest", "@every 1s", withCatchup(events.CatchupLatest, time.Hour)),
		every("latest-out", "@every 1s", withCatchup(events.CatchupLatest, time.Second)),
		every("all", "@every 1s", withCatchup(events.CatchupAll, time.Hour)),
	)
	ids := []string{"none", "latest", "latest-out", "all"}
	mt := newManualTime(t)
	a := mt.startNode(e, "a", nodeOpts{})
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return a.counts().Fired >= 8 }, "a to fire every entry")
	a.stop()
	wm := map[string]time.Time{}
	for _, id := range ids {
		tick, _, ok, err := e.store.Watermark(context.Background(), testPrefix, "default", id)
		if err != nil || !ok {
			t.Fatalf("watermark of %s: %v %v", id, ok, err)
		}
		wm[id] = tick
	}

	mt.advance(12 * time.Second) // nobody runs
	opts := nodeOpts{sched: func(c *scheduler.Config) {
		c.Grace = 1500 * time.Millisecond
		c.MaxCatchup = 3
	}}
	b := mt.startNode(e, "b", opts)
	c := mt.startNode(e, "c", opts)
	mt.advance(3 * time.Second)
	b.stop()
	c.stop()
	e.waitOutboxEmpty(5*time.Second, "default")

	led := ledgers(e.readActivity())
	for _, id := range ids {
		l := led[id]
		from := wm[id].Unix() + 1
		first, last := l.firedRange()
		checkEverySecond(t, id, l, first, last)
		var missed []events.Skipped
		for _, s := range l.skipped {
			if s.Reason != events.SkipMissed {
				t.Errorf("%s: skipped with reason %q", id, s.Reason)
			}
			missed = append(missed, s)
		}
		switch id {
		case "none", "latest-out":
			if len(missed) != 1 || missed[0].ScheduledAt.Unix() != from || missed[0].Count < 10 {
				t.Errorf("%s: want one skipped event from %s covering at least 10 ticks, got %+v", id, fmtUnix(from), missed)
			}
		case "latest":
			if len(missed) != 1 || missed[0].ScheduledAt.Unix() != from || missed[0].Count < 9 {
				t.Fatalf("%s: want one skipped event from %s covering at least 9 ticks, got %+v", id, fmtUnix(from), missed)
			}
			if latest := missed[0].Until.Unix() + 1; l.fired[latest] != 1 {
				t.Errorf("%s: the latest missed tick %s did not fire", id, fmtUnix(latest))
			}
		case "all":
			if len(missed) != 0 {
				t.Errorf("%s: want no skipped events, got %+v", id, missed)
			}
			if last-from < 10 {
				t.Errorf("%s: fired only %s..%s", id, fmtUnix(from), fmtUnix(last))
			}
		}
		for i := 1; i < len(l.order); i++ {
			if !l.order[i].After(l.order[i-1]) {
				t.Errorf("%s: fired out of order: %s after %s", id, l.order[i].Format(time.TimeOnly), l.order[i-1].Format(time.TimeOnly))
			}
		}
	}
	t.Logf("b %+v; c %+v", b.counts(), c.counts())
	_ = fmt.Sprint
}

// TestMissedTicksRecordedAtOnce: ticks the policy drops are recorded when
// they are found missed, in a step of their own, not with the entry's next
// fire (which for an hourly or daily entry may be far away).
func TestMissedTicksRecordedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("minutely", "@every 1m", withCatchup(events.CatchupNone, 0)))
	// This replica's clock is ten minutes ahead of the registration: about
	// ten ticks were missed and the next one is up to a minute away.
	clock := newShiftClock(t, 10*time.Minute)
	a := e.startNode("a", nodeOpts{clock: clock.clock})
	testenv.Eventually(t, 10*time.Second, func() bool { return a.counts().SkippedMissed >= 1 }, "missed ticks recorded")
	a.stop()
	e.waitOutboxEmpty(5*time.Second, "default")
	l := ledgers(e.readActivity())["minutely"]
	if l == nil || len(l.skipped) != 1 {
		t.Fatalf("want one skipped event, got %+v", l)
	}
	s := l.skipped[0]
	if s.Reason != events.SkipMissed || s.Count < 8 || s.Until == nil {
		t.Fatalf("skipped event %+v: want reason missed covering at least 8 ticks", s)
	}
	if len(l.fired) != 0 && clock.now().Sub(*s.Until) < 50*time.Second {
		t.Fatalf("a tick fired although the next one was not due: %v", l.fired)
	}
	// The watermark is the last skipped tick, or a later tick that fired
	// (registered within the grace of a minute boundary, the latest tick
	// is on time and fires).
	want := *s.Until
	for _, at := range l.order {
		if at.After(want) {
			want = at
		}
	}
	tick, _, ok, err := e.store.Watermark(context.Background(), testPrefix, "default", "minutely")
	if err != nil || !ok || !tick.Equal(want) {
		t.Fatalf("watermark %s (%v, %v), want the last skipped or fired tick %s", tick, ok, err, want)
	}
}

// TestEditDuringOutage: while no replica ran, one entry got a new note (not
// a schedule change), another a new cron spec. On the way back, the first
// one's ticks from its watermark on were missed (one skipped event from the
// watermark), while the second's old-spec ticks are not its own (its missed
// ticks start after the change).
func TestEditDuringOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	note := every("note", "@every 1s")
	spec := every("spec", "@every 1s")
	e.put(note, spec)
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 6 }, "a to fire both entries")
	a.stop()
	wm := map[string]time.Time{}
	for _, id := range []string{"note", "spec"} {
		tick, _, ok, err := e.store.Watermark(context.Background(), testPrefix, "default", id)
		if err != nil || !ok {
			t.Fatalf("watermark of %s: %v %v", id, ok, err)
		}
		wm[id] = tick
	}
	// Let the stream's clock pass the watermarks by a few ticks before the
	// edits.
	time.Sleep(3 * time.Second)
	note.Note = "edited while nobody ran"
	spec.Cron = "@every 2s"
	e.put(note, spec)
	edited := time.Now()

	clock := newShiftClock(t, 12*time.Second)
	b := e.startNode("b", nodeOpts{clock: clock.clock, sched: func(c *scheduler.Config) {
		c.Grace = 1500 * time.Millisecond
	}})
	resumed := clock.now()
	waitUntil(t, clock.now, resumed.Add(3*time.Second))
	b.stop()
	e.waitOutboxEmpty(5*time.Second, "default")

	led := ledgers(e.readActivity())
	l := led["note"]
	if len(l.skipped) != 1 || l.skipped[0].ScheduledAt.Unix() != wm["note"].Unix()+1 || l.skipped[0].Count < 10 {
		t.Errorf("note: want one skipped event from the watermark's next tick %s covering at least 10 ticks, got %+v",
			fmtUnix(wm["note"].Unix()+1), l.skipped)
	}
	l = led["spec"]
	if len(l.skipped) != 1 || !l.skipped[0].ScheduledAt.After(edited.Add(-time.Second)) {
		t.Errorf("spec: want one skipped event after the spec change at %s, got %+v", edited.Format(time.TimeOnly), l.skipped)
	}
	for id, l := range led {
		for tick, n := range l.fired {
			if n != 1 {
				t.Errorf("%s: tick %s fired %d times", id, fmtUnix(tick), n)
			}
		}
	}
}
