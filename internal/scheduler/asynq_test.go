package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

// startWorker runs a real asynq server on e's Redis with handler; it is shut
// down at cleanup (after the test released any blocked handler).
func startWorker(t *testing.T, e *env, concurrency int, handler asynq.HandlerFunc) *asynq.Server {
	t.Helper()
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: e.redis.Addr}, asynq.Config{
		Concurrency:       concurrency,
		Queues:            map[string]int{"default": 1},
		TaskCheckInterval: 50 * time.Millisecond,
		LogLevel:          asynq.FatalLevel,
		ShutdownTimeout:   5 * time.Second,
	})
	if err := srv.Start(handler); err != nil {
		t.Fatalf("start asynq server: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// TestOverlapSkipWithRealWorker: an entry with overlap skip whose task is
// held active by a real asynq worker skips its ticks (one skipped event with
// reason overlap each, no task) until the task finishes, then fires again.
func TestOverlapSkipWithRealWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("ov", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapSkip }))
	started := make(chan string, 1)
	release := make(chan struct{})
	var blocked atomic.Bool
	var processed sync.Map
	startWorker(t, e, 1, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if blocked.CompareAndSwap(false, true) {
			started <- id
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		processed.Store(id, true)
		return nil
	})
	mt := newManualTime(t)
	a := mt.startNode(e, "a", nodeOpts{})
	mt.until(20*time.Second, 250*time.Millisecond, blocked.Load, "the worker to get a task")
	first := <-started
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return a.counts().SkippedOverlap >= 3 }, "ticks to be skipped while %s runs", first)
	close(release)
	skipped := a.counts().SkippedOverlap
	mt.until(20*time.Second, 250*time.Millisecond, func() bool {
		n := 0
		processed.Range(func(k, _ any) bool { n++; return true })
		return n >= 3
	}, "the worker to process fires after the overlap ended")
	a.stop()
	e.waitOutboxEmpty(5*time.Second, "default")

	l := ledgers(e.readActivity())["ov"]
	f, last := l.firedRange()
	checkEverySecond(t, "ov", l, f, last)
	var overlap int
	for _, s := range l.skipped {
		if s.Reason != events.SkipOverlap || s.Until != nil {
			t.Errorf("unexpected skipped event %+v", s)
			continue
		}
		overlap++
		if id := schedule.TaskID(testPrefix, "ov", s.ScheduledAt); e.taskExists("default", id) {
			t.Errorf("skipped tick %s has a task", s.ScheduledAt.Format(time.TimeOnly))
		}
		if _, ok := processed.Load(schedule.TaskID(testPrefix, "ov", s.ScheduledAt)); ok {
			t.Errorf("skipped tick %s was processed", s.ScheduledAt.Format(time.TimeOnly))
		}
	}
	if uint64(overlap) < skipped {
		t.Errorf("%d overlap events in the stream, scheduler counted %d", overlap, skipped)
	}
	// Every skipped tick lies while the first task was active: after it.
	firstTick := time.Time{}
	for s := range l.fired {
		if schedule.TaskID(testPrefix, "ov", time.Unix(s, 0)) == first {
			firstTick = time.Unix(s, 0)
		}
	}
	for _, s := range l.skipped {
		if !s.ScheduledAt.After(firstTick) {
			t.Errorf("tick %s skipped before the blocking task %s", s.ScheduledAt.Format(time.TimeOnly), first)
		}
	}
}

// TestPauseResume: no tick fires while an entry is paused, and none of the
// paused ticks is caught up after resume, whatever the catch-up policy.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("p", "@every 1s", withCatchup(events.CatchupAll, time.Hour)))
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 2 }, "a to fire")
	if _, err := e.client.Pause(testenv.Context(t, 10*time.Second), "p", "maintenance"); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	// The pause reaches the scheduler within the projection's delay; then
	// no more fires for three ticks.
	waitUntil(t, time.Now, paused.Add(4*time.Second))
	if _, err := e.client.Resume(testenv.Context(t, 10*time.Second), "p"); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	testenv.Eventually(t, 20*time.Second, func() bool {
		l := ledgers(e.readActivity())["p"]
		_, last := l.firedRange()
		return last >= resumed.Unix()+2
	}, "fires after the resume")
	a.stop()
	e.waitOutboxEmpty(5*time.Second, "default")

	l := ledgers(e.readActivity())["p"]
	if len(l.skipped) > 0 {
		t.Errorf("paused ticks must not be recorded as skipped: %+v", l.skipped)
	}
	var during []int64
	for s := range l.fired {
		if s > paused.Unix()+1 && s <= resumed.Unix() {
			during = append(during, s)
		}
	}
	if len(during) > 0 {
		slices.Sort(during)
		t.Errorf("fired while paused (paused %s, resumed %s): %s", paused.Format("15:04:05.000"), resumed.Format("15:04:05.000"), fmtUnixes(during))
	}
	// Before the pause and after the resume, every second fired once.
	first, last := l.firedRange()
	h := l.handled()
	for s := first; s <= last; s++ {
		if s > paused.Unix() && s <= resumed.Unix() {
			continue // may or may not fire, depending on the projection's delay
		}
		if h[s] != 1 {
			t.Errorf("tick %s handled %d times (paused %s, resumed %s)", fmtUnix(s), h[s], paused.Format("15:04:05.000"), resumed.Format("15:04:05.000"))
		}
	}
}

// TestAsynqSeesFires is INV-asynq-schema for the scheduler: a real asynq server
// processes the fired tasks, and asynq's Inspector lists our entries (spec,
// next, previous) and their enqueue history, as `asynq cron ls` and `asynq
// cron history` do.
func TestAsynqSeesFires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(
		every("vis-a", "@every 1s", inQueue("default")),
		every("vis-b", "@every 2s", inQueue("default")),
		every("vis-paused", "@every 1s", func(en *events.Entry) { en.Paused = true }),
	)
	var mu sync.Mutex
	processed := map[string]string{} // task id → type
	startWorker(t, e, 4, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		processed[id] = task.Type()
		mu.Unlock()
		return nil
	})
	a := e.startNode("a", nodeOpts{})
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: e.redis.Addr})
	defer insp.Close()

	var entries []*asynq.SchedulerEntry
	testenv.Eventually(t, 20*time.Second, func() bool {
		var err error
		entries, err = insp.SchedulerEntries()
		if err != nil || len(entries) != 3 {
			return false
		}
		for _, en := range entries {
			if en.ID != "vis-paused" && en.Prev.IsZero() {
				return false
			}
		}
		return true
	}, "the Inspector to list both active entries with a previous fire and the paused one (has %d)", len(entries))
	now := time.Now()
	for _, en := range entries {
		switch en.ID {
		case "vis-a", "vis-b":
		case "vis-paused":
			if en.Spec != "paused: @every 1s" || !en.Next.IsZero() || !en.Prev.IsZero() {
				t.Errorf("paused entry listed as spec %q next %s prev %s", en.Spec, en.Next, en.Prev)
			}
			continue
		default:
			t.Errorf("unexpected scheduler entry %q", en.ID)
			continue
		}
		spec := map[string]string{"vis-a": "@every 1s", "vis-b": "@every 2s"}[en.ID]
		if en.Spec != spec || en.Task.Type() != "tick:"+en.ID {
			t.Errorf("entry %s: spec %q type %q", en.ID, en.Spec, en.Task.Type())
		}
		if en.Next.Before(now.Add(-2*time.Second)) || en.Next.After(now.Add(3*time.Second)) {
			t.Errorf("entry %s: next %s, now %s", en.ID, en.Next, now)
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(processed) >= 6
	}, "the asynq server to process our tasks")
	history, err := insp.ListSchedulerEnqueueEvents("vis-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(history) == 0 {
		t.Fatal("no enqueue history for vis-a")
	}
	for _, h := range history {
		if _, err := time.Parse(time.RFC3339, h.TaskID[len(testPrefix+":vis-a:"):]); err != nil {
			t.Errorf("history task id %q is not one of ours: %v", h.TaskID, err)
		}
	}
	a.stop()
	mu.Lock()
	defer mu.Unlock()
	for id, typ := range processed {
		if typ != "tick:vis-a" && typ != "tick:vis-b" {
			t.Errorf("processed %s of type %s", id, typ)
		}
	}
}

// TestAsynqSeesPausedEntries: asynq's Inspector (`asynq cron ls`,
// asynqmon) keeps listing an entry while it is paused, its spec marked
// "paused: " and no next enqueue time, and lists it as before once resumed;
// pausing again keeps its last enqueue time.
func TestAsynqSeesPausedEntries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	paused := func(en *events.Entry) { en.Paused = true }
	e.put(every("p", "@every 1s", paused))
	e.startNode("a", nodeOpts{})
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: e.redis.Addr})
	defer insp.Close()
	listed := func(want func(*asynq.SchedulerEntry) bool) func() bool {
		return func() bool {
			entries, err := insp.SchedulerEntries()
			return err == nil && len(entries) == 1 && entries[0].ID == "p" && want(entries[0])
		}
	}
	testenv.Eventually(t, 20*time.Second, listed(func(en *asynq.SchedulerEntry) bool {
		return en.Spec == "paused: @every 1s" && en.Next.IsZero() && en.Prev.IsZero() && en.Task.Type() == "tick:p"
	}), "the paused entry listed, marked paused, with no next or previous enqueue")

	e.put(every("p", "@every 1s"))
	testenv.Eventually(t, 20*time.Second, listed(func(en *asynq.SchedulerEntry) bool {
		return en.Spec == "@every 1s" && !en.Next.IsZero() && !en.Prev.IsZero()
	}), "the resumed entry listed as any other, with a next and a previous enqueue")

	e.put(every("p", "@every 1s", paused))
	testenv.Eventually(t, 20*time.Second, listed(func(en *asynq.SchedulerEntry) bool {
		return en.Spec == "paused: @every 1s" && en.Next.IsZero() && !en.Prev.IsZero()
	}), "the entry paused again, keeping its previous enqueue")
}

// TestEnqueueHistoryCapped: the asynq enqueue history the scheduler writes
// keeps the newest taskstate.MaxSchedulerHistory events per entry, as
// asynq's scheduler does, and asynq's Inspector reads it. Records without
// Trim only add; the next one with Trim cuts back to the cap.
func TestEnqueueHistoryCapped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	base := time.Unix(1_800_000_000, 0)
	var recs []taskstate.EnqueueEventRecord
	for i := range taskstate.MaxSchedulerHistory + 5 {
		recs = append(recs, taskstate.EnqueueEventRecord{Entry: "h", Event: taskstate.SchedulerEnqueueEvent{
			TaskID: fmt.Sprintf("task-%04d", i), EnqueueTime: base.Add(time.Duration(i) * time.Second),
		}})
	}
	key := taskstate.SchedulerHistoryKey("h")
	last := len(recs) - 1
	if err := e.store.RecordSchedulerEnqueueEvents(testenv.Context(t, 10*time.Second), recs[:last]); err != nil {
		t.Fatal(err)
	}
	if n := e.rc.ZCard(context.Background(), key).Val(); n != int64(last) {
		t.Fatalf("history holds %d events before a trim, want %d", n, last)
	}
	recs[last].Trim = true
	if err := e.store.RecordSchedulerEnqueueEvents(testenv.Context(t, 10*time.Second), recs[last:]); err != nil {
		t.Fatal(err)
	}
	if n := e.rc.ZCard(context.Background(), key).Val(); n != taskstate.MaxSchedulerHistory {
		t.Fatalf("history holds %d events, want %d", n, taskstate.MaxSchedulerHistory)
	}
	oldest := e.rc.ZRangeWithScores(context.Background(), key, 0, 0).Val()
	if len(oldest) != 1 || int64(oldest[0].Score) != base.Add(5*time.Second).Unix() {
		t.Fatalf("oldest kept %+v, want the 6th event", oldest)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: e.redis.Addr})
	defer insp.Close()
	evs, err := insp.ListSchedulerEnqueueEvents("h", asynq.PageSize(5))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 5 || evs[0].TaskID != fmt.Sprintf("task-%04d", taskstate.MaxSchedulerHistory+4) {
		t.Fatalf("Inspector's newest events: %+v", evs)
	}
}
