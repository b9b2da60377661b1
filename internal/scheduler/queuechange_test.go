package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

func inQueue(q string) func(*events.Entry) {
	return func(e *events.Entry) { e.Options.Queue = q }
}

// checkQueues asserts that every fired event's task is in the queue the
// event names and in no other of queues.
func checkQueues(t *testing.T, e *env, acts []activity, queues ...string) map[string]int {
	t.Helper()
	perQueue := map[string]int{}
	for _, a := range acts {
		if a.Type != events.TypeEntryFired {
			continue
		}
		perQueue[a.Fired.Queue]++
		for _, q := range queues {
			if got, want := e.taskExists(q, a.Fired.TaskID), q == a.Fired.Queue; got != want {
				t.Errorf("task %s (fired into %s): exists in %s = %v", a.Fired.TaskID, a.Fired.Queue, q, got)
			}
		}
	}
	return perQueue
}

// TestQueueChangeWhileReplicasFire: entries move from queue alpha to beta
// while three replicas fire them. No tick may fire into both queues (the
// watermark is handed over from alpha's slot to beta's), none may be lost,
// and a replica that starts after the change still respects the handover.
func TestQueueChangeWhileReplicasFire(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 10
	var ids []string
	for i := range n {
		id := fmt.Sprintf("q%02d", i)
		ids = append(ids, id)
		e.put(every(id, "@every 1s", inQueue("alpha")))
	}
	r1 := e.startNode("r1", nodeOpts{})
	r2 := e.startNode("r2", nodeOpts{})
	r3 := e.startNode("r3", nodeOpts{})
	fired := func() uint64 { return r1.counts().Fired + r2.counts().Fired + r3.counts().Fired }
	testenv.Eventually(t, 20*time.Second, func() bool { return fired() >= 3*n }, "replicas to fire in alpha")
	for _, id := range ids {
		e.put(every(id, "@every 1s", inQueue("beta")))
	}
	changed := fired()
	testenv.Eventually(t, 20*time.Second, func() bool { return fired() >= changed+3*n }, "replicas to fire in beta")
	// A replica that never saw alpha live.
	r4 := e.startNode("r4", nodeOpts{})
	r1.crash()
	before := fired() + r4.counts().Fired
	testenv.Eventually(t, 20*time.Second, func() bool { return fired()+r4.counts().Fired >= before+2*n }, "replicas to go on firing in beta")
	for _, r := range []*node{r2, r3, r4} {
		r.stop()
	}
	e.waitOutboxEmpty(5*time.Second, "alpha", "beta")

	acts := e.readActivity()
	perQueue := checkQueues(t, e, acts, "alpha", "beta")
	if perQueue["alpha"] < 2*n || perQueue["beta"] < 4*n {
		t.Errorf("fires per queue %v: too few on one side of the change", perQueue)
	}
	led := ledgers(acts)
	for _, id := range ids {
		l := led[id]
		first, last := l.firedRange()
		checkEverySecond(t, id, l, first, last)
		if len(l.skipped) > 0 {
			t.Errorf("%s: unexpected skipped events %+v", id, l.skipped)
		}
		// Once in beta, never back in alpha.
		inBeta := false
		for _, a := range acts {
			if a.Type != events.TypeEntryFired || a.Fired.Entry != id {
				continue
			}
			if a.Fired.Queue == "beta" {
				inBeta = true
			} else if inBeta {
				t.Errorf("%s: fired %s into alpha after firing into beta", id, a.Fired.ScheduledAt.Format(time.TimeOnly))
			}
		}
	}
	t.Logf("fires per queue %v", perQueue)
}

// TestQueueMovedBackWhileDown: an entry moves alpha → beta (seen live, so
// alpha's slot is closed) and, while no replica runs, back to alpha. The
// replica that starts next finds alpha closed by the first move: it must
// reopen alpha (closing beta) and go on firing, never firing a tick twice.
func TestQueueMovedBackWhileDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("x", "@every 1s", inQueue("alpha")))
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 2 }, "a to fire in alpha")
	e.put(every("x", "@every 1s", inQueue("beta")))
	testenv.Eventually(t, 20*time.Second, func() bool { return e.taskCount("beta") >= 2 }, "a to fire in beta")
	a.stop()
	e.put(every("x", "@every 1s", inQueue("alpha")))
	b := e.startNode("b", nodeOpts{})
	alphaBefore := e.taskCount("alpha")
	testenv.Eventually(t, 20*time.Second, func() bool { return e.taskCount("alpha") >= alphaBefore+2 }, "b to fire in alpha again (stats %+v)", b.counts())
	// A replica still on the beta configuration must not fire there now.
	b.stop()
	e.waitOutboxEmpty(5*time.Second, "alpha", "beta")
	acts := e.readActivity()
	checkQueues(t, e, acts, "alpha", "beta")
	l := ledgers(acts)["x"]
	first, last := l.firedRange()
	checkEverySecond(t, "x", l, first, last)
	res, err := e.store.FireBatch(testenv.Context(t, 5*time.Second), staleFences, []taskstate.Fire{staleFire(t, "x", "beta", time.Unix(last+1, 0))})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != taskstate.StatusMoved {
		t.Errorf("a fire into beta after the move back: %s, want moved", res[0].Status)
	}
}

// staleFences are what staleFire's replica presents: an early configuration.
var staleFences = taskstate.Fences{ConfigSeq: 1}

// staleFire is a fire of a replica whose configuration still has entry in
// queue: it expects whatever watermark beta holds.
func staleFire(t *testing.T, entry, queue string, tick time.Time) taskstate.Fire {
	id := schedule.TaskID(testPrefix, entry, tick)
	return taskstate.Fire{
		Prefix: testPrefix, Entry: entry, Queue: queue, Kind: taskstate.FireTick, Tick: tick, ExpectNone: true,
		Msg:         &taskstate.TaskMessage{Type: "tick:" + entry, ID: id},
		FiredRecord: taskstate.Record{ID: "stale:" + id, Data: []byte(`{}`)},
	}
}
