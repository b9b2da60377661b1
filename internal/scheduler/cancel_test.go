package scheduler_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// TestOverlapCancelPreviousWithRealWorker: an entry firing every second
// with overlap cancel-previous, whose handler (a real asynq v0.26.0 worker)
// runs until its context is cancelled, fired by two replicas. Each new tick
// cancels the running task through asynq; the cancelled task, which asynq
// moves to retry, is deleted there, and the held tick fires in its place.
// Never do two tasks of the entry run at once, no tick is handled twice,
// and every replacement is in the activity stream.
func TestOverlapCancelPreviousWithRealWorker(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a run of several seconds with a real asynq worker")
	}
	e := newEnv(t)
	e.put(every("can", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapCancelPrevious }))

	w := startCancellableWorker(t, e)
	a := e.startNode("a", nodeOpts{})
	b := e.startNode("b", nodeOpts{})
	stats := func() (sent, deleted, released uint64) {
		sa, sb := a.counts(), b.counts()
		return sa.CancelsSent + sb.CancelsSent, sa.CancelDeleted + sb.CancelDeleted, sa.Released + sb.Released
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, deleted, released := stats()
		return released >= 4 && deleted >= 4
	}, "four running tasks cancelled and replaced")
	a.stop()
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	if n := w.overlap.Load(); n > 0 {
		t.Errorf("%d times two tasks of the entry ran at once", n)
	}
	acts := e.readActivity()
	l := ledgers(acts)["can"]
	first, last := l.firedRange()
	checkEverySecond(t, "can", l, first, last)
	for id, n := range l.taskIDs {
		if n != 1 {
			t.Errorf("task %s: %d fired events", id, n)
		}
	}
	for _, s := range l.skipped {
		if s.Reason != events.SkipOverlap {
			t.Errorf("unexpected skipped event %+v", s)
		}
	}
	// Each replacement whose held tick fired: the replaced task was
	// cancelled while running and is gone (not left in retry).
	var replaced int
	for _, ac := range acts {
		if ac.Type != events.TypeTaskCancelled {
			continue
		}
		c := ac.Cancelled
		// A previous task the worker had not picked up yet (a loaded
		// machine) is deleted in the fire's own step: that is no
		// replacement of a running task.
		running := c.State == "active" && c.Action == events.CancelRequested
		pending := c.State == "pending" && c.Action == events.CancelDeleted
		if c.Entry != "can" || !(running || pending) ||
			c.ReplacedBy != schedule.TaskID(testPrefix, "can", c.ScheduledAt) || ac.MsgID != events.CancelledEventID("can", c.ScheduledAt) {
			t.Errorf("cancelled event %s: %+v", ac.MsgID, c)
			continue
		}
		if pending {
			if e.taskExists("default", c.TaskID) {
				t.Errorf("deleted pending task %s still exists", c.TaskID)
			}
			continue
		}
		if l.taskIDs[c.ReplacedBy] == 0 {
			continue // held when the replicas stopped
		}
		replaced++
		if e.taskExists("default", c.TaskID) {
			t.Errorf("cancelled task %s still exists", c.TaskID)
		}
	}
	if replaced < 4 {
		t.Errorf("%d replaced tasks in the stream, want at least 4", replaced)
	}
	for _, id := range e.rc.ZRange(context.Background(), taskstate.Keys("default").Retry(), 0, -1).Val() {
		if l.taskIDs[id] > 0 {
			t.Errorf("task %s of the entry stays in retry", id)
		}
	}
	if sent, deleted, _ := stats(); sent < 4 || deleted < 4 {
		t.Errorf("cancels sent %d, deleted %d, want at least 4 each", sent, deleted)
	}
	e.checkEnqueueHistory("can", l)
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, n := range w.runsOf {
		if n != 1 {
			t.Errorf("task %s ran %d times", id, n)
		}
	}
}

// TestOverlapCancelPreviousPending: no worker serves the queue, so the
// previous task is still pending at each tick: it is deleted and the tick
// fires in the same step, leaving exactly one task of the entry queued.
func TestOverlapCancelPreviousPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("canp", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapCancelPrevious }))
	mt := newManualTime(t)
	a := mt.startNode(e, "a", nodeOpts{})
	b := mt.startNode(e, "b", nodeOpts{})
	mt.until(30*time.Second, 250*time.Millisecond, func() bool {
		return a.counts().CancelDeleted+b.counts().CancelDeleted >= 3
	}, "three pending tasks replaced")
	a.stop()
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	l := ledgers(e.readActivity())["canp"]
	first, last := l.firedRange()
	checkEverySecond(t, "canp", l, first, last)
	pending := e.rc.LRange(context.Background(), taskstate.Keys("default").Pending(), 0, -1).Val()
	if len(pending) != 1 || pending[0] != schedule.TaskID(testPrefix, "canp", time.Unix(last, 0)) {
		t.Fatalf("pending list %v, want only the last tick's task", pending)
	}
	var deleted int
	for _, ac := range e.readActivity() {
		if ac.Type == events.TypeTaskCancelled {
			c := ac.Cancelled
			if c.State != "pending" || c.Action != events.CancelDeleted || e.taskExists("default", c.TaskID) {
				t.Errorf("cancelled event %+v", c)
			}
			deleted++
		}
	}
	if deleted < 3 || deleted != len(l.taskIDs)-1 {
		t.Errorf("%d cancelled events for %d fired tasks", deleted, len(l.taskIDs))
	}
}

// TestOverlapCancelPreviousIgnoredCancel: the handler of a real asynq
// worker ignores its context. asynq answers the cancellation anyway: it
// stops waiting for the handler and moves the task to retry, where it is
// deleted and the held tick fires — while the abandoned handler still runs.
// This is why docs/entries.md says a handler must honour ctx cancellation.
func TestOverlapCancelPreviousIgnoredCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("ign", "@every 2s", func(en *events.Entry) { en.Overlap = events.OverlapCancelPrevious }))
	done := make(chan struct{})
	var started sync.Map
	var running atomic.Int32
	var overlapped atomic.Bool
	startWorker(t, e, 4, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started.Store(id, true)
		if running.Add(1) > 1 {
			overlapped.Store(true)
		}
		defer running.Add(-1)
		<-done // ignores ctx
		return nil
	})
	t.Cleanup(func() { close(done) }) // before the worker's shutdown (cleanups run last first)
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 30*time.Second, func() bool {
		st := a.counts()
		return st.Released >= 1 && st.CancelDeleted >= 1
	}, "a held tick released after its cancelled task went to retry")
	testenv.Eventually(t, 10*time.Second, overlapped.Load, "the replacing task to start beside the abandoned handler")
	a.stop()
}

// TestOverlapCancelPreviousStuckActive: the previous task stays active (its
// worker died: nothing answers the cancellation) with a 1 s timeout. The
// held tick waits for it, then fires once the timeout counted from the
// hold (plus the grace) has passed; the stuck task is left to the
// recoverer.
func TestOverlapCancelPreviousStuckActive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("stuck", "@every 3s", func(en *events.Entry) {
		en.Overlap = events.OverlapCancelPrevious
		en.Options.Timeout = events.Duration(time.Second)
	}))
	a := e.startNode("a", nodeOpts{})
	k := taskstate.Keys("default")
	bg := context.Background()
	// Take the first task as asynq's dequeue would, and never finish it.
	var stuck string
	testenv.Eventually(t, 30*time.Second, func() bool {
		ids := e.rc.LRange(bg, k.Pending(), 0, -1).Val()
		if len(ids) == 0 {
			return false
		}
		stuck = ids[0]
		pipe := e.rc.TxPipeline()
		pipe.LRem(bg, k.Pending(), 0, stuck)
		pipe.LPush(bg, k.Active(), stuck)
		pipe.HSet(bg, k.Task(stuck), "state", "active")
		if _, err := pipe.Exec(bg); err != nil {
			t.Fatal(err)
		}
		return true
	}, "the first task")
	testenv.Eventually(t, 10*time.Second, func() bool { return a.counts().CancelsSent >= 1 }, "the cancellation of the stuck task")
	held := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return a.counts().Released >= 1 }, "the held tick to fire past the timeout")
	if waited := time.Since(held); waited < time.Second+4*time.Second {
		t.Errorf("the held tick fired %s after the hold, before the stuck task's timeout and grace", waited)
	}
	a.stop()
	if st := e.rc.HGet(bg, k.Task(stuck), "state").Val(); st != "active" {
		t.Errorf("stuck task is %q, want left active for the recoverer", st)
	}
}

// TestReleaseCancelFencedAfterPause: as TestReleaseHeldFencedAfterPause for
// overlap cancel-previous. A tick is held while the previous task runs,
// then the entry is paused by a newer config event, from which another
// replica fired into the same queue. A replica whose projection still
// shows the entry active finds the cancelled task in retry, but its
// release is refused by the revision fence: the held tick never fires and
// the cancelled task is not deleted.
func TestReleaseCancelFencedAfterPause(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("can", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapCancelPrevious }))
	a := e.startNode("a", nodeOpts{})
	k := taskstate.Keys("default")
	bg := context.Background()
	// Take the first task as asynq's dequeue would, so the next tick is
	// held behind it.
	testenv.Eventually(t, 30*time.Second, func() bool {
		ids := e.rc.LRange(bg, k.Pending(), 0, -1).Val()
		if len(ids) == 0 {
			return false
		}
		pipe := e.rc.TxPipeline()
		pipe.LRem(bg, k.Pending(), 0, ids[0])
		pipe.LPush(bg, k.Active(), ids[0])
		pipe.HSet(bg, k.Task(ids[0]), "state", "active")
		if _, err := pipe.Exec(bg); err != nil {
			t.Fatal(err)
		}
		return true
	}, "the first task")
	var h taskstate.HeldTick
	testenv.Eventually(t, 15*time.Second, func() bool {
		var ok bool
		h, ok = e.heldEntries("default")["can"]
		return ok && h.Cancel
	}, "a tick to be held")
	a.stop()
	before, ok := a.proj.Get("can")
	if !ok {
		t.Fatal("a's projection lost the entry")
	}
	old := a.proj.LastSeq()

	res, err := e.client.Pause(testenv.Context(t, 10*time.Second), "can", "maintenance")
	if err != nil {
		t.Fatal(err)
	}
	other := taskstate.NewTickFire(testPrefix, "default", "other", time.Now().UTC().Truncate(time.Second), time.Time{}, false,
		&taskstate.TaskMessage{Type: "t", ID: "other-1", Queue: "default"}, taskstate.Record{ID: "fired-other-1", Data: []byte(`{}`)})
	if r, err := e.store.FireOnce(testenv.Context(t, 5*time.Second), taskstate.Fences{ConfigSeq: res.Revision}, other); err != nil || r.Status != taskstate.StatusFired {
		t.Fatalf("fire from the newer configuration: %+v, %v", r, err)
	}
	// The cancelled task went to retry: only the fence stands in the way.
	pipe := e.rc.TxPipeline()
	pipe.LRem(bg, k.Active(), 0, h.PrevTaskID)
	pipe.ZAdd(bg, k.Retry(), redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: h.PrevTaskID})
	pipe.HSet(bg, k.Task(h.PrevTaskID), "state", "retry")
	if _, err := pipe.Exec(bg); err != nil {
		t.Fatal(err)
	}

	// The node's debug log tells its refused releases from its refused
	// fires (both count in cronstream_fire_refused_total).
	var logged testlog.Buffer
	lag := e.startNode("lag", nodeOpts{noRelay: true,
		sched: func(c *scheduler.Config) {
			c.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
		},
		projection: func(p *projector.Projector) scheduler.Projection {
			return frozenProjection{Projector: p, seq: old, states: map[string]projector.State{"can": before}}
		}})
	testenv.Eventually(t, 10*time.Second, func() bool { return strings.Count(logged.String(), "held tick not released") >= 2 },
		"lag's release to be fenced")
	if st := lag.counts(); st.Released != 0 || st.DroppedHeld != 0 || st.CancelDeleted != 0 || st.Refused["revision-fenced"] < 2 {
		t.Errorf("a replica behind the fence released %d, dropped %d held ticks, deleted %d cancelled tasks, refused %v",
			st.Released, st.DroppedHeld, st.CancelDeleted, st.Refused)
	}
	if _, ok := e.heldEntries("default")["can"]; !ok {
		t.Error("the held tick is gone")
	}
	if e.taskExists("default", h.TaskID) {
		t.Error("the held tick fired from an older configuration")
	}
	if st := e.rc.HGet(bg, k.Task(h.PrevTaskID), "state").Val(); st != "retry" {
		t.Errorf("the cancelled task is %q, want left in retry", st)
	}
	lag.stop()
}
