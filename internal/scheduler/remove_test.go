package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// removeOf removes id and returns when the config stream stored the
// removal, and its revision.
func (e *env) removeOf(id string) (time.Time, uint64) {
	e.t.Helper()
	res, err := e.client.Remove(testenv.Context(e.t, 10*time.Second), id)
	if err != nil {
		e.t.Fatalf("remove %s: %v", id, err)
	}
	times := e.configTimes(id)
	return times[len(times)-1], res.Revision
}

// TestRemoveWhileRedisUnreachable: two replicas whose Redis is cut off keep
// failing an entry's ticks when the entry is removed; once Redis is back,
// the ticks due before the removal are recorded as skipped (reason
// removed) exactly once, never fired, and nothing fires after, while
// entries in two queues catch up. Registered again before Redis came back,
// the entry still records them, fires nothing of the time it was removed,
// and fires from its registration on; registered again paused, it fires
// nothing after its removal.
func TestRemoveWhileRedisUnreachable(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"removed", "registered again before Redis is back", "registered again paused"} {
		again, paused := name != "removed", name == "registered again paused"
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			a, b, proxy, steady := e.cutOffPair("r")
			stats := func() counts { return sumStats(a, b) }
			// A fire in flight at the cut may still have run: which ticks
			// fired before the removal is read from the stream at the end.
			time.Sleep(3 * time.Second)
			removed, rev := e.removeOf("r")
			time.Sleep(2 * time.Second)
			var registered time.Time
			if again {
				e.put(every("r", "@every 1s", func(en *events.Entry) { en.Paused = paused }))
				times := e.configTimes("r")
				registered = times[len(times)-1]
			}
			errs := stats().Errors
			proxy.Heal()
			// Every tick up to the removal handled: the ones no replica
			// fired recorded as skipped (removed).
			testenv.Eventually(t, 30*time.Second, func() bool {
				return !e.watermarkOf("default", "r").Before(removed.Truncate(time.Second))
			}, "r's ticks up to its removal to be handled")
			if again && !paused {
				testenv.Eventually(t, 20*time.Second, func() bool {
					return !e.watermarkOf("default", "r").Before(registered.Add(2 * time.Second))
				}, "r to fire after its registration")
			} else {
				time.Sleep(2 * time.Second) // nothing more of r may fire
			}
			a.stop()
			b.stop()
			e.waitOutboxEmpty(10*time.Second, "default", "other")
			if errs == 0 {
				t.Errorf("no fire failed while Redis was cut off")
			}
			if n := stats().SkippedRemoved; n > 1 {
				t.Errorf("%d steps recorded r's removed ticks, want at most 1", n)
			}

			led := ledgers(e.readActivity())
			restarted := registered
			if paused {
				restarted = time.Time{} // it never fires again
			}
			checkStopSkip(t, "r", led["r"], events.SkipRemoved, time.Time{}, removed, restarted, false)
			for _, s := range led["r"].skipped {
				if s.Reason == events.SkipRemoved && s.Revision != rev {
					t.Errorf("r: skipped (removed) names revision %d, want the removal's %d", s.Revision, rev)
				}
			}
			if again && !paused {
				checkEverySecond(t, "r", led["r"], registered.Unix()+1, e.watermarkOf("default", "r").Unix())
			} else if got := e.watermarkOf("default", "r"); got.Unix() != removed.Unix() {
				t.Errorf("r's watermark at %s, want its removal's %s", got.Format(time.TimeOnly), removed.Format(time.TimeOnly))
			}
			for _, id := range steady {
				first, last := led[id].firedRange()
				checkEverySecond(t, id, led[id], first, last)
			}
		})
	}
}

// TestRemoveWhileEveryReplicaDown: an entry removed while no replica runs
// has its ticks due before the removal recorded as skipped (reason
// removed) by the next replica to start, never fired; one paused and then
// removed while every replica was down records the ticks due before its
// pause (reason paused, naming the pause's revision). An entry removed
// after a pause the replicas saw records nothing, and an entry that never
// stopped catches up.
func TestRemoveWhileEveryReplicaDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, id := range []string{"r", "rp", "pr", "steady"} {
		e.put(every(id, "@every 1s"))
	}
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 8 }, "a to fire every entry")
	e.pauseOf("pr", "")
	time.Sleep(1500 * time.Millisecond)
	a.stop()
	wmR, wmRP := e.watermarkOf("default", "r"), e.watermarkOf("default", "rp")

	time.Sleep(3 * time.Second)
	removed, rev := e.removeOf("r")
	paused := e.pauseOf("rp", "")
	recs, err := e.client.History(testenv.Context(t, 10*time.Second), "rp")
	if err != nil {
		t.Fatal(err)
	}
	pauseRev := recs[len(recs)-1].Seq
	time.Sleep(time.Second)
	e.removeOf("rp")
	e.removeOf("pr")
	time.Sleep(time.Second)

	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool {
		st := b.counts()
		return st.SkippedRemoved >= 1 && st.SkippedPaused >= 1
	}, "b to record the ticks due before r's removal and rp's pause")
	time.Sleep(2 * time.Second) // nothing more of them may fire
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	led := ledgers(e.readActivity())
	checkStopSkip(t, "r", led["r"], events.SkipRemoved, wmR, removed, time.Time{}, true)
	checkStopSkip(t, "rp", led["rp"], events.SkipPaused, wmRP, paused, time.Time{}, true)
	for _, s := range led["r"].skipped {
		if s.Reason == events.SkipRemoved && s.Revision != rev {
			t.Errorf("r: skipped (removed) names revision %d, want the removal's %d", s.Revision, rev)
		}
	}
	for _, s := range led["rp"].skipped {
		if s.Reason == events.SkipPaused && s.Revision != pauseRev {
			t.Errorf("rp: skipped (paused) names revision %d, want the pause's %d", s.Revision, pauseRev)
		}
	}
	if st := b.counts(); st.SkippedRemoved != 1 || st.SkippedPaused != 1 {
		t.Errorf("b recorded %d removed and %d paused skips, want 1 each (r's and rp's)", st.SkippedRemoved, st.SkippedPaused)
	}
	for _, s := range led["pr"].skipped {
		if s.Reason == events.SkipPaused || s.Reason == events.SkipRemoved {
			t.Errorf("pr, paused while a replica ran: skipped %+v", s)
		}
	}
	first, last := led["steady"].firedRange()
	checkEverySecond(t, "steady", led["steady"], first, last)
}

// TestRestartWhileEveryReplicaDown: an entry paused and resumed, one
// removed and registered again, and one removed and registered again
// paused, while no replica ran have their ticks due before the pause or
// removal recorded as skipped (naming its revision) by the next replica to
// start, which never saw the stop; the first two fire from the resume or
// registration on, and nothing of the time they were stopped; the paused
// one fires nothing after its removal.
func TestRestartWhileEveryReplicaDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, id := range []string{"p", "r", "rp", "steady"} {
		e.put(every(id, "@every 1s"))
	}
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 8 }, "a to fire every entry")
	a.stop()
	wmP, wmR, wmRP := e.watermarkOf("default", "p"), e.watermarkOf("default", "r"), e.watermarkOf("default", "rp")

	time.Sleep(3 * time.Second)
	paused := e.pauseOf("p", "")
	removed, rev := e.removeOf("r")
	removedRP, revRP := e.removeOf("rp")
	recs, err := e.client.History(testenv.Context(t, 10*time.Second), "p")
	if err != nil {
		t.Fatal(err)
	}
	pauseRev := recs[len(recs)-1].Seq
	time.Sleep(2 * time.Second)
	resumed := e.resume("p")
	e.put(every("r", "@every 1s"))
	times := e.configTimes("r")
	registered := times[len(times)-1]
	e.put(every("rp", "@every 1s", func(en *events.Entry) { en.Paused = true }))
	time.Sleep(time.Second)

	b := e.startNode("b", nodeOpts{})
	var st counts
	var wmP2, wmR2 time.Time
	if !testenv.WaitFor(20*time.Second, func() bool {
		st, wmP2, wmR2 = b.counts(), e.watermarkOf("default", "p"), e.watermarkOf("default", "r")
		return st.SkippedRemoved >= 2 && st.SkippedPaused >= 1 && !wmP2.Before(resumed.Add(2*time.Second)) && !wmR2.Before(registered.Add(2*time.Second))
	}) {
		t.Fatalf("b did not record the ticks due before p's pause and r's and rp's removals and fire p and r again: skipped %d paused, %d removed; watermarks p %s, r %s",
			st.SkippedPaused, st.SkippedRemoved, wmP2.Format(time.TimeOnly), wmR2.Format(time.TimeOnly))
	}
	time.Sleep(2 * time.Second) // nothing more of rp may fire
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	led := ledgers(e.readActivity())
	checkStopSkip(t, "p", led["p"], events.SkipPaused, wmP, paused, resumed, true)
	checkStopSkip(t, "r", led["r"], events.SkipRemoved, wmR, removed, registered, true)
	checkStopSkip(t, "rp", led["rp"], events.SkipRemoved, wmRP, removedRP, time.Time{}, true)
	if got := e.watermarkOf("default", "rp"); got.Unix() != removedRP.Unix() {
		t.Errorf("rp's watermark at %s, want its removal's %s", got.Format(time.TimeOnly), removedRP.Format(time.TimeOnly))
	}
	for id, want := range map[string]uint64{"p": pauseRev, "r": rev, "rp": revRP} {
		for _, s := range led[id].skipped {
			if (s.Reason == events.SkipPaused || s.Reason == events.SkipRemoved) && s.Revision != want {
				t.Errorf("%s: skipped (%s) names revision %d, want the stop's %d", id, s.Reason, s.Revision, want)
			}
		}
	}
	if st := b.counts(); st.SkippedRemoved != 2 || st.SkippedPaused != 1 {
		t.Errorf("b recorded %d removed and %d paused skips, want 2 (r's and rp's) and 1 (p's)", st.SkippedRemoved, st.SkippedPaused)
	}
	checkEverySecond(t, "p", led["p"], resumed.Unix()+1, e.watermarkOf("default", "p").Unix())
	checkEverySecond(t, "r", led["r"], registered.Unix()+1, e.watermarkOf("default", "r").Unix())
	first, last := led["steady"].firedRange()
	checkEverySecond(t, "steady", led["steady"], first, last)
}

// TestRemoveSteadyEntries: entries removed, at every point of the second,
// while three replicas fire them on time leave nothing to record: no
// skipped event, and no tick fires once the removal reached the replicas. (Steps the fire
// script refused meanwhile are logged: there are none while each entry's
// shard has one owner.)
func TestRemoveSteadyEntries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var ids []string
	for i := range 12 {
		id := fmt.Sprintf("s%02d", i)
		ids = append(ids, id)
		e.put(every(id, "@every 1s"))
	}
	nodes := []*node{e.startNode("a", nodeOpts{}), e.startNode("b", nodeOpts{}), e.startNode("c", nodeOpts{})}
	total := func(f func(counts) uint64) uint64 {
		var n uint64
		for _, nd := range nodes {
			n += f(nd.counts())
		}
		return n
	}
	fired := func(st counts) uint64 { return st.Fired }
	refused := func(st counts) uint64 { return st.Refused["watermark-mismatch"] }
	testenv.Eventually(t, 20*time.Second, func() bool { return total(fired) >= 5*uint64(len(ids)) }, "the replicas to fire every entry")
	before := total(refused)
	removed := map[string]time.Time{}
	for _, id := range ids[:8] {
		removed[id], _ = e.removeOf(id)
		time.Sleep(150 * time.Millisecond) // removals at every point of the second
	}
	time.Sleep(5 * time.Second) // as long as any replica might still try a tick of before the removal
	for _, nd := range nodes {
		nd.stop()
	}
	e.waitOutboxEmpty(10*time.Second, "default")
	t.Logf("refused while removing: %d", total(refused)-before)
	// A removal takes effect when each replica receives it: a tick due in
	// the moment between the removal's storing and its delivery (removals
	// land at every point of the second, some a few milliseconds before a
	// tick) may still fire, but never one fired later than that.
	const delivery = time.Second
	acts := e.readActivity()
	removedSkips(t, acts, removed, delivery)
	slipped := 0
	for _, a := range acts {
		at, ok := removed[a.Fired.Entry]
		if a.Type != events.TypeEntryFired || !ok || !a.Fired.ScheduledAt.After(at) {
			continue
		}
		if late := a.Fired.EnqueuedAt.Sub(at); late > delivery {
			t.Errorf("%s: tick %s fired at %s, %s after its removal at %s", a.Fired.Entry, a.Fired.ScheduledAt.Format(time.TimeOnly),
				a.Fired.EnqueuedAt.Format("15:04:05.000"), late.Round(time.Millisecond), at.Format("15:04:05.000"))
		}
		slipped++
	}
	t.Logf("ticks due between a removal's storing and its delivery that fired: %d", slipped)
}

// removedSkips checks the ticks of entries fired on time until removed (at
// removed[entry]): each due before its removal is handled once, and only a
// tick the replicas were still firing when the removal came (due less than
// late before it: a machine busy with other tests) is recorded as skipped
// with reason removed, never an older one.
func removedSkips(t *testing.T, acts []activity, removed map[string]time.Time, late time.Duration) {
	t.Helper()
	n := 0
	for _, a := range acts {
		if a.Type != events.TypeEntrySkipped || a.Skipped.Reason != events.SkipRemoved {
			continue
		}
		n++
		if at, ok := removed[a.Skipped.Entry]; !ok || at.Sub(a.Skipped.ScheduledAt) > late {
			t.Errorf("%s: tick %s recorded as skipped (removed), due %s before its removal: it fired on time until then", a.Skipped.Entry,
				a.Skipped.ScheduledAt.Format(time.TimeOnly), at.Sub(a.Skipped.ScheduledAt).Round(time.Millisecond))
		}
	}
	led := ledgers(acts)
	for id, at := range removed {
		if l := led[id]; l != nil {
			first, _ := l.firedRange()
			checkEverySecond(t, id, l, first, at.Unix()-1)
		}
	}
	t.Logf("ticks still being fired when their entry's removal came, recorded as skipped: %d", n)
}

// TestFoundStoppedChangedWhileLoading: an entry removed, and one paused,
// while every replica was down, then registered again and resumed while
// the next replica to start loads them (its Redis cut off, so its loads
// fail and it applies the changes between them): the ticks due before
// the removal or the pause are still recorded as skipped, once, by the
// schedule they belonged to; nothing of the time the entries were stopped
// fires; each fires from its registration or resume on.
func TestFoundStoppedChangedWhileLoading(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, id := range []string{"r", "p", "steady"} {
		e.put(every(id, "@every 1s"))
	}
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 6 }, "a to fire every entry")
	a.stop()
	wmR, wmP := e.watermarkOf("default", "r"), e.watermarkOf("default", "p")
	time.Sleep(3 * time.Second)
	removed, removal := e.removeOf("r")
	paused := e.pauseOf("p", "")
	time.Sleep(time.Second)

	proxy := testenv.StartProxy(t, e.redis.Addr)
	proxy.Cut(testenv.Drop)
	opts := e.redis.Options()
	opts.Addr = proxy.Addr()
	rc := redis.NewClient(opts)
	t.Cleanup(func() { _ = rc.Close() })
	// b runs alone, firing every entry: with shard ownership a replica
	// whose Redis is cut off takes no shard (the leases are in Redis), so
	// it would load nothing before Redis is back; here its loads must
	// fail while the changes come.
	b := e.startNode("b", nodeOpts{rc: rc, ownsAll: true})
	time.Sleep(2 * time.Second) // b has found both; its loads fail
	e.put(every("r", "@every 1s"))
	times := e.configTimes("r")
	registered := times[len(times)-1]
	resumed := e.resume("p")
	time.Sleep(time.Second)
	proxy.Heal()
	testenv.Eventually(t, 30*time.Second, func() bool {
		st := b.counts()
		return st.SkippedRemoved >= 1 && st.SkippedPaused >= 1 &&
			!e.watermarkOf("default", "r").Before(registered.Add(2*time.Second)) &&
			!e.watermarkOf("default", "p").Before(resumed.Add(2*time.Second))
	}, "b to record the stopped ticks and fire both entries again")
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	led := ledgers(e.readActivity())
	checkStopSkip(t, "r", led["r"], events.SkipRemoved, wmR, removed, registered, true)
	checkStopSkip(t, "p", led["p"], events.SkipPaused, wmP, paused, resumed, true)
	for _, s := range led["r"].skipped {
		if s.Reason == events.SkipRemoved && s.Revision != removal {
			t.Errorf("r: skipped (removed) names revision %d, want the removal's %d", s.Revision, removal)
		}
	}
	checkEverySecond(t, "r", led["r"], registered.Unix()+1, e.watermarkOf("default", "r").Unix())
	checkEverySecond(t, "p", led["p"], resumed.Unix()+1, e.watermarkOf("default", "p").Unix())
	if st := b.counts(); st.SkippedRemoved != 1 || st.SkippedPaused != 1 {
		t.Errorf("b recorded %d removed and %d paused skips, want 1 each", st.SkippedRemoved, st.SkippedPaused)
	}
}
