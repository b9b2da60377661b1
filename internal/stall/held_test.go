package stall

import (
	"context"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/firetest"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// TestCheckHeldTickNeverLate: an entry with overlap buffer-one whose tick is
// held (its previous task is still pending) is not late for it, though no
// fired event exists yet: the hold moved the watermark like a fire.
func TestCheckHeldTickNeverLate(t *testing.T) {
	r := testenv.StartRedis(t)
	store := taskstate.New(r.Client(t))
	names := events.MustNames("stalltest")
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Minute).Add(40 * time.Second)
	st := state(t, events.Entry{ID: "buf", Cron: "@every 1m", Overlap: events.OverlapBufferOne}, now.Add(-time.Hour))
	fire := func(tick, prev time.Time, want taskstate.FireStatus) {
		t.Helper()
		id := schedule.TaskID(names.Prefix(), "buf", tick)
		f := taskstate.NewTickFire(names.Prefix(), "default", "buf", tick, prev, !prev.IsZero(),
			&taskstate.TaskMessage{Type: "t", ID: id, Queue: "default"},
			taskstate.Record{ID: "fired-" + id, Data: []byte(`{}`)})
		f.OverlapBuffer, f.OverlapRecord = true, taskstate.Record{ID: "overlap-" + id, Data: []byte(`{}`)}
		res, err := store.FireOnce(ctx, taskstate.Fences{ConfigSeq: 1}, f)
		if err != nil || res.Status != want {
			t.Fatalf("fire %s: %+v, %v; want %s", tick, res, err, want)
		}
	}
	tick0 := now.Truncate(time.Minute).Add(-time.Minute)
	tick1 := now.Truncate(time.Minute)
	fire(tick0, time.Time{}, taskstate.StatusFired) // pending: no worker
	fire(tick1, tick0, taskstate.StatusHeld)

	late, err := Check(ctx, store, names, []projector.State{st}, now, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(late) != 0 {
		t.Fatalf("late %+v, want none while the tick is held", late)
	}
}

// TestCheckCancelHeldTickNeverLate: an entry with overlap cancel-previous
// whose tick is held while its running previous task is cancelled is not
// late for it.
func TestCheckCancelHeldTickNeverLate(t *testing.T) {
	r := testenv.StartRedis(t)
	rc := r.Client(t)
	store := taskstate.New(rc)
	names := events.MustNames("stalltest")
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Minute).Add(40 * time.Second)
	st := state(t, events.Entry{ID: "can", Cron: "@every 1m", Overlap: events.OverlapCancelPrevious}, now.Add(-time.Hour))
	tick0 := now.Truncate(time.Minute).Add(-time.Minute)
	tick1 := now.Truncate(time.Minute)
	firetest.HoldTick(t, rc, names.Prefix(), "can", tick0, tick1)

	late, err := Check(ctx, store, names, []projector.State{st}, now, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(late) != 0 {
		t.Fatalf("late %+v, want none while the tick is held", late)
	}
}
