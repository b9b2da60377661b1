package scheduler_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/firetest"
	"github.com/cronstream/cronstream/internal/promtest"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// heldStartBound is how long after a task ends the held tick's task may
// start: the release check's period (250 ms), the worker's idle poll
// (asynq sleeps a second when its queues are empty), and room for timers
// that slip on a machine busy with the rest of the suite under -race.
const heldStartBound = 250*time.Millisecond + time.Second + 750*time.Millisecond

// TestOverlapBufferOneWithRealWorker: an entry firing every second with
// overlap buffer-one, whose handler (a real asynq v0.26.0 worker) takes 2.5 s,
// fired by two replicas. While a task is busy one tick is held and the
// others are skipped with reason overlap; each held tick fires once, within
// a second of the previous task finishing, as the task of its own tick with
// its original scheduled time in the fired event; never do two tasks of the
// entry run at once.
func TestOverlapBufferOneWithRealWorker(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a 10 s run with a real asynq worker")
	}
	e := newEnv(t)
	e.put(every("buf", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapBufferOne }))

	var runs firetest.Runs
	startWorker(t, e, 4, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		runs.Work(ctx, id, 2500*time.Millisecond) // longer than the period
		return nil
	})
	a := e.startNode("a", nodeOpts{})
	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 30*time.Second, func() bool {
		return a.counts().Released+b.counts().Released >= 3
	}, "three held ticks to be released")
	a.stop()
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")
	// Every task the stream says fired has run to its end.
	l := ledgers(e.readActivity())["buf"]
	testenv.Eventually(t, 10*time.Second, func() bool { return runs.Finished(maps.Keys(l.taskIDs)) },
		"the fired tasks to finish")

	if n := runs.Overlaps(); n > 0 {
		t.Errorf("%d times two tasks of the entry ran at once", n)
	}
	first, last := l.firedRange()
	checkEverySecond(t, "buf", l, first, last)
	var skippedOverlap int
	for _, s := range l.skipped {
		if s.Reason != events.SkipOverlap {
			t.Errorf("unexpected skipped event %+v", s)
		}
		skippedOverlap++
		if e.taskExists("default", schedule.TaskID(testPrefix, "buf", s.ScheduledAt)) {
			t.Errorf("skipped tick %s has a task", s.ScheduledAt.Format(time.TimeOnly))
		}
	}
	if skippedOverlap == 0 {
		t.Error("no tick was skipped with reason overlap while one was held")
	}

	ran := runs.All()
	for id, r := range ran {
		if r.Times != 1 {
			t.Errorf("task %s ran %d times", id, r.Times)
		}
	}
	// The fired tasks in the order they ran; each one fired from a held
	// tick started within a second (plus the worker's pick-up) of the end
	// of the task before it, and carries its own tick's time and task.
	ticks := slices.Clone(l.order)
	slices.SortFunc(ticks, func(x, y time.Time) int { return x.Compare(y) })
	held := 0
	for i, tick := range ticks {
		id := schedule.TaskID(testPrefix, "buf", tick)
		if l.taskIDs[id] != 1 {
			t.Errorf("tick %s: %d fired events name its task %s", tick.Format(time.TimeOnly), l.taskIDs[id], id)
			continue
		}
		if i == 0 {
			continue
		}
		prev, prevRan := ran[schedule.TaskID(testPrefix, "buf", ticks[i-1])]
		cur, curRan := ran[id]
		if !prevRan || !curRan {
			t.Errorf("tick %s or the one before never ran", tick.Format(time.TimeOnly))
			continue
		}
		if !tick.Before(prev.End) {
			continue // fired on time, nothing was busy
		}
		held++
		if wait := cur.Start.Sub(prev.End); wait > heldStartBound {
			t.Errorf("held tick %s started %s after the previous task ended", tick.Format(time.TimeOnly), wait)
		}
	}
	if held < 3 {
		t.Errorf("%d held ticks fired, want at least 3 (ticks %v)", held, ticks)
	}
	if got := a.counts().Released + b.counts().Released; got < uint64(held) {
		t.Errorf("replicas released %d held ticks, %d fired late", got, held)
	}
	e.checkEnqueueHistory("buf", l)
}

// checkEnqueueHistory asserts that asynq's enqueue history of entry
// (`asynq cron history`, asynqmon) lists every task l fired, released held
// ticks included.
func (e *env) checkEnqueueHistory(entry string, l *ledger) {
	e.t.Helper()
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: e.redis.Addr})
	defer insp.Close()
	evs, err := insp.ListSchedulerEnqueueEvents(entry, asynq.PageSize(1000))
	if err != nil {
		e.t.Fatal(err)
	}
	inHistory := map[string]bool{}
	for _, ev := range evs {
		inHistory[ev.TaskID] = true
	}
	for id := range l.taskIDs {
		if !inHistory[id] {
			e.t.Errorf("%s: fired task %s is not in asynq's enqueue history", entry, id)
		}
	}
}

// heldEntries returns the entries holding a tick in queue, by entry.
func (e *env) heldEntries(queue string) map[string]taskstate.HeldTick {
	e.t.Helper()
	held, err := e.store.HeldTicks(testenv.Context(e.t, 5*time.Second), testPrefix, []string{queue})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]taskstate.HeldTick{}
	for _, h := range held {
		out[h.Entry] = h
	}
	return out
}

// TestBufferOneHeldDroppedOnLoad: ticks held for entries that are then
// paused, moved off buffer-one or removed while no replica runs are
// dropped by the next replica to start — found through asynq's queue list,
// since no buffer-one entry uses their queue any more — each with a skipped
// event (reason overlap-dropped) at its tick, counted in
// cronstream_held_dropped_total by reason, and never fired; the held tick
// of an entry still on buffer-one stays held.
func TestBufferOneHeldDroppedOnLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	buf := func(queue string) func(*events.Entry) {
		return func(en *events.Entry) {
			en.Overlap = events.OverlapBufferOne
			en.Options.Queue = queue
		}
	}
	// No worker: every first task stays pending, so the next tick is held.
	e.put(every("keep", "@every 1s", buf("default")),
		every("paused", "@every 1s", buf("q2")), every("policy", "@every 1s", buf("q2")), every("removed", "@every 1s", buf("q2")))
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 15*time.Second, func() bool {
		return len(e.heldEntries("default")) == 1 && len(e.heldEntries("q2")) == 3
	}, "every entry to hold a tick")
	a.stop()
	held := e.heldEntries("q2")

	c := testenv.Context(t, 10*time.Second)
	if _, err := e.client.Pause(c, "paused", "maintenance"); err != nil {
		t.Fatal(err)
	}
	e.put(every("policy", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapSkip; en.Options.Queue = "q2" }))
	if _, err := e.client.Remove(c, "removed"); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	b := e.startNode("b", nodeOpts{sched: func(c *scheduler.Config) { c.Metrics = scheduler.NewMetrics(reg) }})
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.heldEntries("q2")) == 0 }, "the held ticks of q2 to be dropped")
	if len(e.heldEntries("default")) != 1 {
		t.Error("the held tick of the entry still on buffer-one was dropped")
	}
	if got := b.counts().DroppedHeld; got != 3 {
		t.Errorf("DroppedHeld %d, want 3", got)
	}
	for _, reason := range []string{"paused", "policy", "removed"} {
		if v, ok := promtest.Value(t, reg, "cronstream_held_dropped_total", "reason", reason); !ok || v != 1 {
			t.Errorf("cronstream_held_dropped_total{reason=%q} = %v (gathered: %t), want 1", reason, v, ok)
		}
	}
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default", "q2")

	dropped := map[string]time.Time{}
	for _, act := range e.readActivity() {
		if act.Type == events.TypeEntrySkipped && act.Skipped.Reason == events.SkipOverlapDropped {
			if _, dup := dropped[act.Skipped.Entry]; dup {
				t.Errorf("two overlap-dropped events for %s", act.Skipped.Entry)
			}
			dropped[act.Skipped.Entry] = act.Skipped.ScheduledAt
		}
		if act.Type == events.TypeEntryFired {
			if h, ok := held[act.Fired.Entry]; ok && act.Fired.ScheduledAt.Equal(h.Tick) {
				t.Errorf("the dropped held tick %s of %s fired", h.Tick, h.Entry)
			}
		}
	}
	for entry, h := range held {
		if at, ok := dropped[entry]; !ok || !at.Equal(h.Tick) {
			t.Errorf("%s: overlap-dropped event at %v (found %v), want at the held tick %v", entry, at, ok, h.Tick)
		}
		if e.taskExists("q2", h.TaskID) {
			t.Errorf("%s: the dropped tick's task %s exists", entry, h.TaskID)
		}
	}
	if _, ok := dropped["keep"]; ok {
		t.Error("the held tick of the entry still on buffer-one was dropped")
	}
}

// TestBufferOneMaxFires: a buffer-one entry with max_fires 3 whose task
// (a real asynq worker) outlasts its period creates exactly 3 tasks, held
// ones released included (a release counts as a fire), and then completes.
func TestBufferOneMaxFires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("lim", "@every 1s", func(en *events.Entry) {
		en.Overlap = events.OverlapBufferOne
		en.MaxFires = 3
	}))
	var (
		mu  sync.Mutex
		ran = map[string]int{}
	)
	startWorker(t, e, 4, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		ran[id]++
		mu.Unlock()
		select {
		case <-time.After(1500 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	a := e.startNode("a", nodeOpts{})
	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool {
		return a.counts().Completed+b.counts().Completed > 0
	}, "the entry to complete")
	if a.counts().Released+b.counts().Released == 0 {
		t.Error("no held tick was released: the test did not exercise buffer-one")
	}
	// A few more periods: nothing more fires.
	deadline := time.Now().Add(3 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(deadline) }, "")
	a.stop()
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")
	l := ledgers(e.readActivity())["lim"]
	if len(l.taskIDs) != 3 {
		t.Errorf("%d tasks fired, want exactly 3: %v", len(l.taskIDs), l.taskIDs)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) >= len(l.taskIDs)
	}, "the fired tasks to run")
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 3 {
		t.Errorf("the worker ran %d tasks, want exactly 3: %v", len(ran), ran)
	}
	for _, s := range l.skipped {
		if s.Reason != events.SkipOverlap {
			t.Errorf("unexpected skipped event %+v", s)
		}
	}
}

// frozenProjection is a live projection whose answers about the entries
// and the sequence stay those of an earlier moment: a replica whose view
// of the config stream is behind.
type frozenProjection struct {
	*projector.Projector
	seq    uint64
	states map[string]projector.State
}

func (p frozenProjection) LastSeq() uint64  { return p.seq }
func (p frozenProjection) FenceSeq() uint64 { return p.seq }

func (p frozenProjection) Get(id string) (projector.State, bool) {
	st, ok := p.states[id]
	return st, ok
}

// TestReleaseHeldFencedAfterPause: a tick is held, then the entry is paused
// by a newer config event, from which another replica fired into the same
// queue. A replica whose projection still shows the entry active on
// buffer-one (its view is behind) finds the previous task done, but its
// release is refused by the revision fence: the held tick never fires.
func TestReleaseHeldFencedAfterPause(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("buf", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapBufferOne }))
	a := e.startNode("a", nodeOpts{})
	var h taskstate.HeldTick
	testenv.Eventually(t, 15*time.Second, func() bool {
		var ok bool
		h, ok = e.heldEntries("default")["buf"]
		return ok
	}, "a tick to be held")
	a.stop()
	before, ok := a.proj.Get("buf")
	if !ok {
		t.Fatal("a's projection lost the entry")
	}
	old := a.proj.LastSeq()

	res, err := e.client.Pause(testenv.Context(t, 10*time.Second), "buf", "maintenance")
	if err != nil {
		t.Fatal(err)
	}
	// A replica at the pause's sequence fires another entry into the slot.
	other := taskstate.NewTickFire(testPrefix, "default", "other", time.Now().UTC().Truncate(time.Second), time.Time{}, false,
		&taskstate.TaskMessage{Type: "t", ID: "other-1", Queue: "default"}, taskstate.Record{ID: "fired-other-1", Data: []byte(`{}`)})
	if r, err := e.store.FireOnce(testenv.Context(t, 5*time.Second), taskstate.Fences{ConfigSeq: res.Revision}, other); err != nil || r.Status != taskstate.StatusFired {
		t.Fatalf("fire from the newer configuration: %+v, %v", r, err)
	}
	// The previous task is done: only the fence stands in the way.
	if err := e.rc.Del(testenv.Context(t, 5*time.Second), taskstate.Keys("default").Task(h.PrevTaskID)).Err(); err != nil {
		t.Fatal(err)
	}

	lag := e.startNode("lag", nodeOpts{noRelay: true, projection: func(p *projector.Projector) scheduler.Projection {
		return frozenProjection{Projector: p, seq: old, states: map[string]projector.State{"buf": before}}
	}})
	testenv.Eventually(t, 10*time.Second, func() bool { return lag.counts().Refused["revision-fenced"] >= 2 },
		"lag's release to be fenced (%+v)", lag.counts())
	if st := lag.counts(); st.Released != 0 || st.DroppedHeld != 0 {
		t.Errorf("a replica behind the fence released %d and dropped %d held ticks", st.Released, st.DroppedHeld)
	}
	if _, ok := e.heldEntries("default")["buf"]; !ok {
		t.Error("the held tick is gone")
	}
	if e.taskExists("default", h.TaskID) {
		t.Error("the held tick fired from an older configuration")
	}
}
