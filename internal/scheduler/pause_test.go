package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// pauseOf pauses id and returns when the config stream stored the pause.
func (e *env) pauseOf(id, note string) time.Time {
	e.t.Helper()
	if _, err := e.client.Pause(testenv.Context(e.t, 10*time.Second), id, note); err != nil {
		e.t.Fatalf("pause %s: %v", id, err)
	}
	times := e.configTimes(id)
	return times[len(times)-1]
}

// resume resumes id and returns when the config stream stored the resume.
func (e *env) resume(id string) time.Time {
	e.t.Helper()
	if _, err := e.client.Resume(testenv.Context(e.t, 10*time.Second), id); err != nil {
		e.t.Fatalf("resume %s: %v", id, err)
	}
	times := e.configTimes(id)
	return times[len(times)-1]
}

// configTimes returns when the config stream stored each of id's events,
// oldest first.
func (e *env) configTimes(id string) []time.Time {
	e.t.Helper()
	recs, err := e.client.History(testenv.Context(e.t, 10*time.Second), id)
	if err != nil || len(recs) == 0 {
		e.t.Fatalf("history of %s: %d records, %v", id, len(recs), err)
	}
	out := make([]time.Time, len(recs))
	for i, r := range recs {
		out[i] = r.Time
	}
	return out
}

func (e *env) watermarkOf(queue, id string) time.Time {
	e.t.Helper()
	tick, _, ok, err := e.store.Watermark(context.Background(), testPrefix, queue, id)
	if err != nil || !ok {
		e.t.Fatalf("watermark of %s: %v %v", id, ok, err)
	}
	return tick
}

// cutOffPair registers entry id firing every second beside two entries
// that catch up every missed tick, steady and other (in queue "other"),
// starts two replicas that reach Redis through a proxy, waits until they
// fire, and cuts Redis off (the proxy dropping connections). It returns the
// replicas, the proxy to heal, and the two steady entries' ids.
func (e *env) cutOffPair(id string) (a, b *node, proxy *testenv.TCPProxy, steady []string) {
	e.t.Helper()
	e.put(every(id, "@every 1s"), every("steady", "@every 1s", withCatchup(events.CatchupAll, time.Hour)),
		every("other", "@every 1s", inQueue("other"), withCatchup(events.CatchupAll, time.Hour)))
	proxy = testenv.StartProxy(e.t, e.redis.Addr)
	node := func(name string) *node {
		opts := e.redis.Options()
		opts.Addr = proxy.Addr()
		rc := redis.NewClient(opts)
		e.t.Cleanup(func() { _ = rc.Close() })
		// With the history, as a replica runs: the replica that owns the
		// entry's shard after the outage may not be the one that saw the
		// pause live (both lost their leases while Redis was cut off).
		return e.startNode(name, nodeOpts{rc: rc})
	}
	a, b = node("a"), node("b")
	testenv.Eventually(e.t, 20*time.Second, func() bool { return sumStats(a, b).Fired >= 6 }, "the replicas to fire every entry")
	proxy.Cut(testenv.Drop)
	return a, b, proxy, []string{"steady", "other"}
}

// sumStats adds up the counters the tests read over nodes.
func sumStats(nodes ...*node) counts {
	var sum counts
	for _, n := range nodes {
		st := n.counts()
		sum.Fired += st.Fired
		sum.Errors += st.Errors
		sum.SkippedPaused += st.SkippedPaused
		sum.SkippedRemoved += st.SkippedRemoved
	}
	return sum
}

// checkStopSkip asserts, for an every-second entry paused or removed at
// stopped (reason events.SkipPaused or events.SkipRemoved), that its ticks
// up to then were each handled once: fired, or the last unfired ones
// recorded as one skipped event with that reason that ends at stopped (and
// starts after wm, when set: the watermark when every replica stopped).
// Nothing fired since (until restarted, when set: resumed or registered
// again). mustSkip requires the skipped event; otherwise every tick up to
// stopped may have fired, by a replica whose fire pass was under way when
// the change came (it applies changes after that pass).
func checkStopSkip(t *testing.T, id string, l *ledger, reason string, wm, stopped, restarted time.Time, mustSkip bool) {
	t.Helper()
	var got []events.Skipped
	for _, s := range l.skipped {
		if s.Reason == reason {
			got = append(got, s)
		} else if !s.ScheduledAt.After(stopped) {
			t.Errorf("%s: skipped with reason %q at %s, before it was %s", id, s.Reason, s.ScheduledAt.Format(time.TimeOnly), reason)
		}
	}
	first, _ := l.firedRange()
	checkEverySecond(t, id, l, first, stopped.Unix())
	for sec, n := range l.fired {
		if sec > stopped.Unix() && (restarted.IsZero() || sec <= restarted.Unix()) {
			t.Errorf("%s: tick %s fired %d times while %s", id, fmtUnix(sec), n, reason)
		}
	}
	switch {
	case len(got) == 0 && !mustSkip:
		t.Logf("%s: every tick up to when it was %s fired", id, reason)
		return
	case len(got) != 1:
		t.Fatalf("%s: want one skipped event (%s) ending at %s, got %+v", id, reason, stopped.Format(time.TimeOnly), got)
	}
	s := got[0]
	until := s.ScheduledAt
	if s.Until != nil {
		until = *s.Until
	}
	if until.Unix() != stopped.Unix() || (!wm.IsZero() && s.ScheduledAt.Unix() != wm.Unix()+1) {
		t.Errorf("%s: skipped (%s) %s..%s (%d ticks), want up to %s from after the watermark %s", id, reason,
			s.ScheduledAt.Format(time.TimeOnly), until.Format(time.TimeOnly), s.Count, stopped.Format(time.TimeOnly), wm.Format(time.TimeOnly))
	}
	if want := int(until.Unix() - s.ScheduledAt.Unix() + 1); max(s.Count, 1) != want {
		t.Errorf("%s: skipped (%s) event counts %d ticks, its range %d", id, reason, s.Count, want)
	}
}

// TestPauseWhileEveryReplicaDown: an entry paused while no replica runs
// has its ticks due before the pause recorded as skipped (reason paused)
// by the next replica to start, never fired; ticks while paused are not
// recorded, and after a resume it fires from the resume. Entries paused
// while a replica ran, one of them edited while every replica was down,
// record nothing, and an entry never paused catches up by its policy.
func TestPauseWhileEveryReplicaDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"p", "steady", "idle", "edited"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 8 }, "a to fire every entry")
	e.pauseOf("idle", "")
	e.pauseOf("edited", "first")
	time.Sleep(1500 * time.Millisecond)
	a.stop()
	wm := e.watermarkOf("default", "p")

	time.Sleep(3 * time.Second)
	paused := e.pauseOf("p", "while down")
	e.pauseOf("edited", "second") // an edit while paused moves its last config time
	time.Sleep(2 * time.Second)

	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return b.counts().SkippedPaused >= 1 }, "b to record p's ticks due before its pause")
	resumed := e.resume("p")
	testenv.Eventually(t, 20*time.Second, func() bool {
		return !e.watermarkOf("default", "p").Before(resumed.Add(2 * time.Second))
	}, "p to fire after its resume")
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	led := ledgers(e.readActivity())
	checkStopSkip(t, "p", led["p"], events.SkipPaused, wm, paused, resumed, true)
	if st := b.counts(); st.SkippedPaused != 1 {
		t.Errorf("b recorded %d paused skips, want 1 (p's)", st.SkippedPaused)
	}
	for _, id := range []string{"idle", "edited"} {
		for _, s := range led[id].skipped {
			if s.Reason == events.SkipPaused {
				t.Errorf("%s, paused while a replica ran: skipped (paused) %+v", id, s)
			}
		}
	}
	first, last := led["steady"].firedRange()
	checkEverySecond(t, "steady", led["steady"], first, last)
	for _, s := range led["steady"].skipped {
		if s.Reason != events.SkipMissed {
			t.Errorf("steady: skipped with reason %q", s.Reason)
		}
	}
	// p fires from its resume on, and records no missed ticks for its pause.
	checkEverySecond(t, "p", led["p"], resumed.Unix()+1, e.watermarkOf("default", "p").Unix())
	for _, s := range led["p"].skipped {
		if s.Reason == events.SkipMissed {
			t.Errorf("p: the ticks of its pause recorded as missed: %+v", s)
		}
	}
}

// TestPauseWhileRedisUnreachable: two replicas whose Redis is cut off keep
// failing an entry's ticks when the entry is paused; once Redis is back,
// the ticks due before the pause are recorded as skipped (reason paused)
// exactly once, never fired, while entries in two queues catch up.
// Resumed before Redis came back, the entry still records them, then fires
// from its resume.
func TestPauseWhileRedisUnreachable(t *testing.T) {
	t.Parallel()
	for _, resumeFirst := range []bool{false, true} {
		name := "paused"
		if resumeFirst {
			name = "resumed before Redis is back"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			a, b, proxy, steady := e.cutOffPair("p")
			stats := func() counts { return sumStats(a, b) }
			// A fire in flight at the cut may still have run: which ticks
			// fired before the pause is read from the stream at the end.
			time.Sleep(3 * time.Second)
			paused := e.pauseOf("p", "")
			time.Sleep(time.Second)
			var resumed time.Time
			if resumeFirst {
				resumed = e.resume("p")
			}
			errs := stats().Errors
			proxy.Heal()
			// Every tick up to the pause handled: the ones no replica fired
			// recorded as skipped (paused).
			testenv.Eventually(t, 30*time.Second, func() bool {
				return !e.watermarkOf("default", "p").Before(paused.Truncate(time.Second))
			}, "p's ticks up to its pause to be handled")
			if resumeFirst {
				testenv.Eventually(t, 20*time.Second, func() bool {
					return !e.watermarkOf("default", "p").Before(resumed.Add(2 * time.Second))
				}, "p to fire after its resume")
			} else {
				time.Sleep(2 * time.Second) // p must stay paused
			}
			a.stop()
			b.stop()
			e.waitOutboxEmpty(10*time.Second, "default", "other")
			if errs == 0 {
				t.Errorf("no fire failed while Redis was cut off")
			}
			if n := stats().SkippedPaused; n > 1 {
				t.Errorf("%d steps recorded p's paused ticks, want at most 1", n)
			}

			led := ledgers(e.readActivity())
			checkStopSkip(t, "p", led["p"], events.SkipPaused, time.Time{}, paused, resumed, false)
			if resumeFirst {
				checkEverySecond(t, "p", led["p"], resumed.Unix()+1, e.watermarkOf("default", "p").Unix())
			} else if got := e.watermarkOf("default", "p"); got.Unix() != paused.Unix() {
				t.Errorf("p's watermark at %s, want its pause's %s", got.Format(time.TimeOnly), paused.Format(time.TimeOnly))
			}
			for _, id := range steady {
				first, last := led[id].firedRange()
				checkEverySecond(t, id, led[id], first, last)
			}
		})
	}
}
