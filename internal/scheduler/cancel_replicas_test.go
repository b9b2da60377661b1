package scheduler_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestOverlapCancelPreviousAcrossReplicaKill: the cancel-previous run of
// TestOverlapCancelPreviousWithRealWorker with three replicas, the owner of
// the entry's shard killed after two replacements (no flush, no lease
// release, its heartbeat left to expire). The others take the entry over
// once its lease lapses: the held tick
// and the cancellations the killed replica left are finished by them, no
// tick is handled twice, never two tasks of the entry run at once, and no
// cancelled task stays in retry.
func TestOverlapCancelPreviousAcrossReplicaKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a run of several seconds with three replicas and a real asynq worker")
	}
	e := newEnv(t)
	entry := every("cank", "@every 1s", func(en *events.Entry) { en.Overlap = events.OverlapCancelPrevious })
	e.put(entry)

	w := startCancellableWorker(t, e)
	nodes := map[string]*node{}
	for _, id := range []string{"a", "b", "c"} {
		nodes[id] = e.startNode(id, nodeOpts{})
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(nodes["a"].members.Live()) == 3 }, "three live replicas")
	deleted := func() (n uint64) {
		for _, nd := range nodes {
			n += nd.counts().CancelDeleted
		}
		return n
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return deleted() >= 2 }, "two running tasks replaced")
	// The shards are handed over to their desired owners after the
	// start; once each replica holds its share, the lease of the entry's
	// shard stays where it is until the kill.
	settledOwners(t, []string{entry.Options.QueueName()}, 20*time.Second, nodes["a"], nodes["b"], nodes["c"])
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, nd := range nodes {
			if r := nd.own.Report(); r.Owned != r.Desired {
				return false
			}
		}
		return true
	}, "each replica to hold its share")
	victim := e.leaseHolder(events.ShardOfEntry(entry.Options.QueueName(), entry.ID))
	if nodes[victim] == nil {
		t.Fatalf("the lease of the entry's shard is held by %q, not one of the replicas", victim)
	}
	nodes[victim].crash()
	delete(nodes, victim)
	killedAt := deleted()
	testenv.Eventually(t, 40*time.Second, func() bool { return deleted() >= killedAt+4 }, "four more replacements after %s was killed", victim)
	for _, nd := range nodes {
		nd.stop()
	}
	e.waitOutboxEmpty(10*time.Second, "default")

	if n := w.overlap.Load(); n > 0 {
		t.Errorf("%d times two tasks of the entry ran at once", n)
	}
	acts := e.readActivity()
	l := ledgers(acts)["cank"]
	for id, n := range l.taskIDs {
		if n != 1 {
			t.Errorf("task %s: %d fired events", id, n)
		}
	}
	for tick, n := range l.handled() {
		if n != 1 {
			t.Errorf("tick %s handled %d times", fmtUnix(tick), n)
		}
	}
	for _, ac := range acts {
		if ac.Type == events.TypeTaskCancelled && ac.Cancelled.Entry == "cank" && l.taskIDs[ac.Cancelled.ReplacedBy] > 0 &&
			e.taskExists("default", ac.Cancelled.TaskID) {
			t.Errorf("cancelled task %s still exists", ac.Cancelled.TaskID)
		}
	}
	// A cancellation the stop cut short is left to the next replica: its
	// task in retry, the tick that replaces it still held.
	held := e.heldEntries("default")["cank"]
	for _, id := range e.rc.ZRange(context.Background(), taskstate.Keys("default").Retry(), 0, -1).Val() {
		if l.taskIDs[id] > 0 && !(held.Cancel && held.PrevTaskID == id) {
			t.Errorf("task %s of the entry stays in retry (held: %+v)", id, held)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, n := range w.runsOf {
		if n != 1 {
			t.Errorf("task %s ran %d times", id, n)
		}
	}
}

// cancellableWorker is a real asynq worker whose handler runs until its
// context is cancelled, counting each task's runs and the times two ran at
// once.
type cancellableWorker struct {
	mu      sync.Mutex
	runsOf  map[string]int
	running atomic.Int32
	overlap atomic.Int32
}

func startCancellableWorker(t *testing.T, e *env) *cancellableWorker {
	w := &cancellableWorker{runsOf: map[string]int{}}
	startWorker(t, e, 4, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if w.running.Add(1) > 1 {
			w.overlap.Add(1)
		}
		defer w.running.Add(-1)
		w.mu.Lock()
		w.runsOf[id]++
		w.mu.Unlock()
		<-ctx.Done() // runs until cancelled
		return ctx.Err()
	})
	return w
}
