package main

import (
	"context"
	"slices"
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

// TestOverlapCancelPreviousCLI: --overlap cancel-previous is stored (under
// the gated event type), shown by ls and describe, completed, accepted in a
// schedules file; a bad value names it; describe shows the tick held while
// the running previous task is cancelled.
func TestOverlapCancelPreviousCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "can", "--cron", "@every 1h", "--type", "t", "--overlap", "cancel-previous")
	if msg := e.fail("entry", "put", "bad", "--cron", "@every 1h", "--type", "t", "--overlap", "cancel"); !strings.Contains(msg, "must be allow, skip, buffer-one or cancel-previous") {
		t.Errorf("bad overlap value: %s", msg)
	}
	if msg := e.fail("entry", "put", "grouped", "--cron", "@every 1h", "--type", "t", "--overlap", "cancel-previous", "--group", "g"); !strings.Contains(msg, "cannot be combined with options.group") {
		t.Errorf("cancel-previous with a group: %s", msg)
	}
	if out := e.ok("entry", "ls", "-o", "wide"); !strings.Contains(out, "cancel-previous") {
		t.Errorf("ls -o wide does not show the policy:\n%s", out)
	}
	if got, _ := completions(t, e, "entry", "put", "x", "--overlap", ""); !slices.Contains(got, "cancel-previous") {
		t.Errorf("--overlap completes %v", got)
	}
	file := writeFile(t, "schedules.yaml", `
entries:
  - id: from-file
    cron: "@every 1h"
    task: {type: t}
    overlap: cancel-previous
`)
	e.ok("sync", "-f", file)
	var fromFile describeView
	e.okJSON(&fromFile, "entry", "describe", "from-file", "--json")
	if fromFile.Entry.Overlap != events.OverlapCancelPrevious {
		t.Errorf("schedules file: overlap %q", fromFile.Entry.Overlap)
	}

	// Hold a tick as the fire script does while the previous task runs.
	rc := e.redis.Client(t)
	store := taskstate.New(rc)
	prefix := events.DefaultPrefix
	tick0 := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	tick1 := tick0.Add(time.Hour)
	fire := func(tick, prev time.Time, want taskstate.FireStatus) {
		t.Helper()
		id := scheduler.TaskID(prefix, "can", tick)
		f := taskstate.NewTickFire(prefix, "default", "can", tick, prev, !prev.IsZero(),
			&taskstate.TaskMessage{Type: "t", ID: id, Queue: "default"},
			taskstate.Record{ID: "fired-" + id, Data: []byte(`{}`)})
		f.OverlapCancel, f.OverlapRecord = true, taskstate.Record{ID: "overlap-" + id, Data: []byte(`{}`)}
		var err error
		f.CancelRecord, err = taskstate.NewCancelRecord("cancel-"+id, []byte(`{"task_id":"\u0000task\u0000","state":"\u0000state\u0000","action":"\u0000action\u0000"}`))
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.FireOnce(context.Background(), taskstate.Fences{ConfigSeq: 1}, f)
		if err != nil || res.Status != want {
			t.Fatalf("fire %s: %+v, %v; want %s", tick, res, err, want)
		}
	}
	fire(tick0, time.Time{}, taskstate.StatusFired)
	id0, k := scheduler.TaskID(prefix, "can", tick0), taskstate.Keys("default")
	rc.LRem(context.Background(), k.Pending(), 0, id0)
	rc.LPush(context.Background(), k.Active(), id0)
	rc.HSet(context.Background(), k.Task(id0), "state", "active")
	fire(tick1, tick0, taskstate.StatusHeld)

	var v describeView
	e.okJSON(&v, "entry", "describe", "can", "--json")
	if v.Entry.Overlap != events.OverlapCancelPrevious {
		t.Errorf("describe overlap %q", v.Entry.Overlap)
	}
	if v.Held == nil || !v.Held.Cancelling || v.Held.WaitingFor != id0 || v.Held.TaskID != scheduler.TaskID(prefix, "can", tick1) {
		t.Errorf("describe held %+v", v.Held)
	}
	if out := e.ok("entry", "describe", "can"); !strings.Contains(out, "held tick (overlap cancel-previous)") {
		t.Errorf("describe text:\n%s", out)
	}
}
