package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/scheduler"
)

// TestOverlapBufferOneCLI: --overlap buffer-one is stored and shown, refused
// with a group, and describe shows the tick the entry holds in Redis.
func TestOverlapBufferOneCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "buf", "--cron", "@every 1h", "--type", "t", "--overlap", "buffer-one")
	if msg := e.fail("entry", "put", "grouped", "--cron", "@every 1h", "--type", "t", "--overlap", "buffer-one", "--group", "g"); !strings.Contains(msg, "cannot be combined with options.group") {
		t.Errorf("buffer-one with a group: %s", msg)
	}

	// Hold a tick as the fire script does while the previous task is busy.
	store := taskstate.New(e.redis.Client(t))
	prefix := events.DefaultPrefix
	tick0 := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	tick1 := tick0.Add(time.Hour)
	fire := func(tick, prev time.Time, want taskstate.FireStatus) {
		t.Helper()
		id := scheduler.TaskID(prefix, "buf", tick)
		f := taskstate.NewTickFire(prefix, "default", "buf", tick, prev, !prev.IsZero(),
			&taskstate.TaskMessage{Type: "t", ID: id, Queue: "default"},
			taskstate.Record{ID: "fired-" + id, Data: []byte(`{}`)})
		f.OverlapBuffer, f.OverlapRecord = true, taskstate.Record{ID: "overlap-" + id, Data: []byte(`{}`)}
		res, err := store.FireOnce(context.Background(), taskstate.Fences{ConfigSeq: 1}, f)
		if err != nil || res.Status != want {
			t.Fatalf("fire %s: %+v, %v; want %s", tick, res, err, want)
		}
	}
	fire(tick0, time.Time{}, taskstate.StatusFired)
	fire(tick1, tick0, taskstate.StatusHeld)

	var v describeView
	e.okJSON(&v, "entry", "describe", "buf", "--json")
	if v.Entry.Overlap != events.OverlapBufferOne {
		t.Errorf("describe overlap %q", v.Entry.Overlap)
	}
	want := describeHeld{ScheduledAt: tick1, TaskID: scheduler.TaskID(prefix, "buf", tick1), WaitingFor: scheduler.TaskID(prefix, "buf", tick0)}
	if v.Held == nil || !v.Held.ScheduledAt.Equal(want.ScheduledAt) || v.Held.TaskID != want.TaskID || v.Held.WaitingFor != want.WaitingFor {
		t.Errorf("describe held %+v, want %+v", v.Held, want)
	}
	if out := e.ok("entry", "describe", "buf"); !strings.Contains(out, "held tick (overlap buffer-one)") || !strings.Contains(out, "buffer-one") {
		t.Errorf("describe text:\n%s", out)
	}

	// status counts the held tick, then the dropped one.
	heldCounts := func() (held, dropped int64) {
		t.Helper()
		var rep statusReport
		e.okJSON(&rep, "status", "--json")
		for _, q := range rep.Queues {
			if q.Queue == "default" {
				return q.Held, q.HeldDropped
			}
		}
		t.Fatalf("status lists no queue default: %+v", rep.Queues)
		return 0, 0
	}
	if held, dropped := heldCounts(); held != 1 || dropped != 0 {
		t.Errorf("status: %d held, %d dropped; want 1, 0", held, dropped)
	}
	hs, err := store.HeldTicks(context.Background(), prefix, []string{"default"})
	if err != nil || len(hs) != 1 {
		t.Fatalf("held ticks %v, %v", hs, err)
	}
	if out, err := store.ReleaseHeld(context.Background(), taskstate.Fences{ConfigSeq: 1}, hs[0], taskstate.HeldRelease{Drop: true}); err != nil || out != taskstate.HeldDropped {
		t.Fatalf("drop: %v, %v", out, err)
	}
	if held, dropped := heldCounts(); held != 0 || dropped != 1 {
		t.Errorf("status after the drop: %d held, %d dropped; want 0, 1", held, dropped)
	}
	if out := e.ok("status"); !strings.Contains(out, "default: 0 held tick(s) waiting (overlap buffer-one), 1 dropped unfired") {
		t.Errorf("status text shows no dropped held tick:\n%s", out)
	}
}
