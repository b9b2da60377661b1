// Package firetest makes, through taskstate's fire script, the Redis states
// that tests of the views and the command line start from: a tick of a
// cancel-previous entry held while its previous task runs (HoldTick). It
// also records what a real worker does with an entry's tasks (Runs), for
// the overlap tests of the scheduler and the command line, and builds the
// schedule of a spec (Schedule) for the tests of fire times. It is for
// tests only; non-test code must not import it.
package firetest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// HoldTick fires tick0 of the cancel-previous entry in queue "default"
// (under the task id prefix), lets a worker take its task (what asynq's
// dequeue writes), then fires tick1, which the fire script holds while
// that task runs. The test fails if either fire ends otherwise.
func HoldTick(t testing.TB, rc redis.UniversalClient, prefix, entry string, tick0, tick1 time.Time) {
	t.Helper()
	ctx := context.Background()
	store := taskstate.New(rc)
	fire := func(tick, prev time.Time, want taskstate.FireStatus) {
		t.Helper()
		id := schedule.TaskID(prefix, entry, tick)
		f := taskstate.NewTickFire(prefix, "default", entry, tick, prev, !prev.IsZero(),
			&taskstate.TaskMessage{Type: "t", ID: id, Queue: "default"},
			taskstate.Record{ID: "fired-" + id, Data: []byte(`{}`)})
		f.OverlapCancel, f.OverlapRecord = true, taskstate.Record{ID: "overlap-" + id, Data: []byte(`{}`)}
		var err error
		f.CancelRecord, err = taskstate.NewCancelRecord("cancel-"+id, []byte(`{"task_id":"\u0000task\u0000","state":"\u0000state\u0000","action":"\u0000action\u0000"}`))
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.FireOnce(ctx, taskstate.Fences{ConfigSeq: 1}, f)
		if err != nil || res.Status != want {
			t.Fatalf("fire %s: %+v, %v; want %s", tick, res, err, want)
		}
	}
	fire(tick0, time.Time{}, taskstate.StatusFired)
	id0, k := schedule.TaskID(prefix, entry, tick0), taskstate.Keys("default")
	for _, err := range []error{
		rc.LRem(ctx, k.Pending(), 0, id0).Err(),
		rc.LPush(ctx, k.Active(), id0).Err(),
		rc.HSet(ctx, k.Task(id0), "state", "active").Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	fire(tick1, tick0, taskstate.StatusHeld)
}
