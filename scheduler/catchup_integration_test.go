package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/scheduler"
)

func withCatchup(p events.CatchupPolicy, window time.Duration) func(*events.Entry) {
	return func(e *events.Entry) { e.Catchup = events.Catchup{Policy: p, Window: events.Duration(window)} }
}

// TestCatchupAfterOutage: a replica set fires, goes down, and comes back
// (its clock moved 12 s on, with a 1.5 s grace: at least 10 ticks were
// missed). Two replicas come back at once and race on the same gaps:
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
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.sched.Stats().Fired >= 8 }, "a to fire every entry")
	a.stop()
	wm := map[string]time.Time{}
	for _, id := range ids {
		tick, _, ok, err := e.store.Watermark(context.Background(), testPrefix, "default", id)
		if err != nil || !ok {
			t.Fatalf("watermark of %s: %v %v", id, ok, err)
		}
		wm[id] = tick
	}

	clock := newShiftClock(t, 12*time.Second)
	opts := nodeOpts{clock: clock.clock, sched: func(c *scheduler.Config) {
		c.Grace = 1500 * time.Millisecond
		c.MaxCatchup = 3
	}}
	b := e.startNode("b", opts)
	c := e.startNode("c", opts)
	resumed := clock.now()
	waitUntil(t, clock.now, resumed.Add(3*time.Second))
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
	t.Logf("b %+v; c %+v", b.sched.Stats(), c.sched.Stats())
	_ = fmt.Sprint
}
