package scheduler_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/scheduler"
)

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

	type run struct{ start, end time.Time }
	var (
		mu      sync.Mutex
		runs    = map[string]*run{}
		runsOf  = map[string]int{}
		running atomic.Int32
		overlap atomic.Int32
	)
	startWorker(t, e, 4, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if running.Add(1) > 1 {
			overlap.Add(1)
		}
		defer running.Add(-1)
		mu.Lock()
		runs[id] = &run{start: time.Now()}
		runsOf[id]++
		mu.Unlock()
		select { // the work: longer than the period
		case <-time.After(2500 * time.Millisecond):
		case <-ctx.Done():
		}
		mu.Lock()
		runs[id].end = time.Now()
		mu.Unlock()
		return nil
	})
	a := e.startNode("a", nodeOpts{})
	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 30*time.Second, func() bool {
		return a.sched.Stats().Released+b.sched.Stats().Released >= 3
	}, "three held ticks to be released")
	a.stop()
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")
	// Every task the stream says fired has run to its end.
	l := ledgers(e.readActivity())["buf"]
	testenv.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range l.taskIDs {
			if r := runs[id]; r == nil || r.end.IsZero() {
				return false
			}
		}
		return true
	}, "the fired tasks to finish")

	if n := overlap.Load(); n > 0 {
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
		if e.taskExists("default", scheduler.TaskID(testPrefix, "buf", s.ScheduledAt)) {
			t.Errorf("skipped tick %s has a task", s.ScheduledAt.Format(time.TimeOnly))
		}
	}
	if skippedOverlap == 0 {
		t.Error("no tick was skipped with reason overlap while one was held")
	}

	mu.Lock()
	defer mu.Unlock()
	for id, n := range runsOf {
		if n != 1 {
			t.Errorf("task %s ran %d times", id, n)
		}
	}
	// The fired tasks in the order they ran; each one fired from a held
	// tick started within a second (plus the worker's pick-up) of the end
	// of the task before it, and carries its own tick's time and task.
	ticks := slices.Clone(l.order)
	slices.SortFunc(ticks, func(x, y time.Time) int { return x.Compare(y) })
	held := 0
	for i, tick := range ticks {
		id := scheduler.TaskID(testPrefix, "buf", tick)
		if l.taskIDs[id] != 1 {
			t.Errorf("tick %s: %d fired events name its task %s", tick.Format(time.TimeOnly), l.taskIDs[id], id)
			continue
		}
		if i == 0 {
			continue
		}
		prev := runs[scheduler.TaskID(testPrefix, "buf", ticks[i-1])]
		cur := runs[id]
		if prev == nil || cur == nil {
			t.Errorf("tick %s or the one before never ran", tick.Format(time.TimeOnly))
			continue
		}
		if !tick.Before(prev.end) {
			continue // fired on time, nothing was busy
		}
		held++
		if wait := cur.start.Sub(prev.end); wait > 1250*time.Millisecond {
			t.Errorf("held tick %s started %s after the previous task ended", tick.Format(time.TimeOnly), wait)
		}
	}
	if held < 3 {
		t.Errorf("%d held ticks fired, want at least 3 (ticks %v)", held, ticks)
	}
	if got := a.sched.Stats().Released + b.sched.Stats().Released; got < uint64(held) {
		t.Errorf("replicas released %d held ticks, %d fired late", got, held)
	}
}
