package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/schedule"
)

// TestReplicasFireEveryTickOnce is INV-once and INV-outbox across replicas: three
// replicas fire 50 entries every second for about 20 s; one starts late and
// one is killed mid-run. Every (entry, second) must be one task in Redis and
// one fired event in the activity stream, with no second missed.
func TestReplicasFireEveryTickOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a 20 s run of three replicas (runs without -short, as in CI)")
	}
	e := newEnv(t)
	const entries = 50
	var ids []string
	for i := range entries {
		id := fmt.Sprintf("e%02d", i)
		ids = append(ids, id)
		e.put(every(id, "@every 1s"))
	}
	now := time.Now
	start := time.Now()
	// The subject is once across replicas, not the grace (the ownership
	// tests hold takeovers to it): a replica starved for seconds beside
	// the rest of the suite catches up instead of skipping.
	o := nodeOpts{sched: func(c *scheduler.Config) { c.Grace = 20 * time.Second }}
	r1 := e.startNode("r1", o)
	r2 := e.startNode("r2", o)
	waitUntil(t, now, start.Add(7*time.Second))
	r3 := e.startNode("r3", o)
	waitUntil(t, now, start.Add(12*time.Second))
	r1.crash()
	waitUntil(t, now, start.Add(20*time.Second))
	r2.stop()
	r3.stop()
	stopped := time.Now()
	// r1's outbox records (if any were left) are published by nobody now;
	// every record must already be out, since r2 and r3 flushed on stop
	// after taking over r1's lease.
	e.waitOutboxEmpty(10*time.Second, "default")

	acts := e.readActivity()
	led := ledgers(acts)
	pending := map[string]int{}
	for _, id := range e.pendingIDs("default") {
		pending[id]++
	}
	for id, n := range pending {
		if n > 1 {
			t.Errorf("task %s is %d times in the pending list", id, n)
		}
	}
	var fired int
	for _, id := range ids {
		l := led[id]
		if l == nil {
			t.Errorf("entry %s never fired", id)
			continue
		}
		first, last := l.firedRange()
		// The first tick is the first after the nodes started (the
		// registration was a moment before), the last within a second or
		// two of the stop.
		if first > start.Add(3*time.Second).Unix() {
			t.Errorf("entry %s: first fire %s, nodes started %s", id, fmtUnix(first), start.Format("15:04:05"))
		}
		if last < stopped.Add(-3*time.Second).Unix() {
			t.Errorf("entry %s: last fire %s, nodes stopped %s", id, fmtUnix(last), stopped.Format("15:04:05"))
		}
		if len(l.skipped) > 0 {
			t.Errorf("entry %s: unexpected skipped events %+v", id, l.skipped)
		}
		checkEverySecond(t, id, l, first, last)
		for s := first; s <= last; s++ {
			task := schedule.TaskID(testPrefix, id, time.Unix(s, 0))
			if pending[task] != 1 {
				t.Errorf("task %s: %d in the pending list, want 1", task, pending[task])
			}
			if l.taskIDs[task] != 1 {
				t.Errorf("task %s: %d fired events, want 1", task, l.taskIDs[task])
			}
		}
		fired += len(l.fired)
	}
	if len(pending) != fired {
		t.Errorf("%d tasks in Redis, %d fired events", len(pending), fired)
	}
	for _, a := range acts {
		if a.Type != events.TypeEntryFired {
			t.Errorf("unexpected activity %s %s", a.Type, a.MsgID)
		}
	}
	st2, st3 := r2.counts(), r3.counts()
	t.Logf("%d fires over %d entries; r2 %+v; r3 %+v", fired, entries, st2, st3)
}
