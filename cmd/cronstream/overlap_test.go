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
}
