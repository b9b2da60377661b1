package scheduler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// flush publishes every outbox record with a one-off relay.
func (e *env) flush() {
	e.t.Helper()
	r, err := relay.New(relay.Config{Outbox: e.store, JS: e.js, Names: testNames, Owner: "flush", Logger: testLogger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := r.Flush(testenv.Context(e.t, 20*time.Second)); err != nil {
		e.t.Fatal(err)
	}
	if err := r.Stop(testenv.Context(e.t, 10*time.Second)); err != nil {
		e.t.Fatal(err)
	}
}

// TestTriggerAndBackfillIdempotent: a retried trigger (same request id) and
// a repeated backfill fire nothing twice, before and after their events are
// in the stream; neither moves the watermark.
func TestTriggerAndBackfillIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("m", "*/2 * * * * *"))
	now := time.Now()
	m := scheduler.Manual{Redis: e.rc, JS: e.js, Names: testNames, Source: "cronstream/test", Now: func() time.Time { return now }}
	c := testenv.Context(t, 30*time.Second)
	st, err := m.Load(c, "m")
	if err != nil {
		t.Fatal(err)
	}

	id1, created, err := m.Trigger(c, st, "req-1")
	if err != nil || !created {
		t.Fatalf("first trigger: %s %v %v", id1, created, err)
	}
	again, created, err := m.Trigger(c, st, "req-1")
	if err != nil || created || again != id1 {
		t.Fatalf("retried trigger: %s %v %v, want %s not created", again, created, err, id1)
	}
	id2, created, err := m.Trigger(c, st, "req-2")
	if err != nil || !created || id2 == id1 {
		t.Fatalf("second request: %s %v %v", id2, created, err)
	}
	if _, _, err := m.Trigger(c, st, "bad id!"); err == nil {
		t.Fatal("a request id that is no valid id must be refused")
	}

	from, to := now.Add(-20*time.Second).Truncate(time.Second), now.Add(-time.Second).Truncate(time.Second)
	res, err := m.Backfill(c, st, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ticks < 9 || len(res.Fired) != res.Ticks || res.Already != 0 {
		t.Fatalf("first backfill: %+v", res)
	}
	// Retried before the relay published anything: the tasks exist.
	res2, err := m.Backfill(c, st, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if len(res2.Fired) != 0 || res2.Already != res.Ticks {
		t.Fatalf("retried backfill: %+v", res2)
	}
	e.flush()
	// Retried after: the stream says they fired.
	res3, err := m.Backfill(c, st, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if len(res3.Fired) != 0 || res3.Already != res.Ticks {
		t.Fatalf("backfill after publishing: %+v", res3)
	}
	if _, _, ok, err := e.store.Watermark(context.Background(), testPrefix, "default", "m"); err != nil || ok {
		t.Fatalf("trigger and backfill must not move the watermark (ok %v, err %v)", ok, err)
	}
	if _, err := m.Backfill(c, st, from, now.Add(time.Hour)); err == nil {
		t.Fatal("a backfill into the future must fail")
	}
	if _, err := m.Backfill(c, st, now.Add(-24*time.Hour), now); !errors.Is(err, scheduler.ErrTooManyTicks) {
		t.Fatalf("a day of every-2s ticks: %v, want ErrTooManyTicks", err)
	}

	e.flush()
	acts := e.readActivity()
	var triggers, backfills int
	tasks := map[string]int{}
	for _, a := range acts {
		if a.Type != events.TypeEntryFired {
			t.Errorf("unexpected %s %s", a.Type, a.MsgID)
			continue
		}
		tasks[a.Fired.TaskID]++
		switch {
		case a.Fired.Trigger != "":
			triggers++
		case a.Fired.Backfill:
			backfills++
		}
	}
	if triggers != 2 || backfills != res.Ticks {
		t.Errorf("stream has %d trigger and %d backfill events, want 2 and %d", triggers, backfills, res.Ticks)
	}
	for id, n := range tasks {
		if n != 1 {
			t.Errorf("task %s has %d events", id, n)
		}
		if !e.taskExists("default", id) {
			t.Errorf("task %s is not in Redis", id)
		}
	}
	if got := len(e.pendingIDs("default")); got != len(tasks) {
		t.Errorf("%d tasks pending, %d events", got, len(tasks))
	}
}

// TestManualFireAfterConfigChange: the revision fence holds stream-wide
// sequences. A manual fire whose Target was read before a config event
// that a replica has since fired from (the fence is above its ConfigSeq)
// is built again from the current configuration and fires; a fence above
// anything the stream holds refuses it with ErrRefused, and a refused
// backfill tick is never counted as fired already.
func TestManualFireAfterConfigChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("m1", "@every 2s"), every("m2", "@every 2s"))
	m := scheduler.Manual{Redis: e.rc, JS: e.js, Names: testNames, Source: "cronstream/test"}
	c := testenv.Context(t, 30*time.Second)
	target, err := m.Load(c, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if target.ConfigSeq != 2 || target.Revision != 1 {
		t.Fatalf("target: config seq %d, revision %d; want 2 and 1", target.ConfigSeq, target.Revision)
	}
	seq := e.put(every("m2", "@every 2s", withPayload("changed")))
	fence := taskstate.Own(testPrefix, "default").Fence()
	if err := e.rc.Set(c, fence, seq, 0).Err(); err != nil { // a replica fired from seq
		t.Fatal(err)
	}
	if _, created, err := m.Trigger(c, target, "after-change"); err != nil || !created {
		t.Fatalf("trigger with a target older than the fence: created %v, %v", created, err)
	}
	from := time.Now().Add(-10 * time.Second)
	res, err := m.Backfill(c, target, from, time.Now())
	if err != nil || len(res.Fired) != res.Ticks || res.Ticks < 4 {
		t.Fatalf("backfill with a target older than the fence: %+v, %v", res, err)
	}

	if err := e.rc.Set(c, fence, 1_000_000, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Trigger(c, target, "fenced"); !errors.Is(err, scheduler.ErrRefused) || !strings.Contains(err.Error(), "revision-fenced") {
		t.Fatalf("trigger under a fence above the stream: %v, want ErrRefused (revision-fenced)", err)
	}
	res, err = m.Backfill(c, target, from.Add(-20*time.Second), from.Add(-time.Second))
	if !errors.Is(err, scheduler.ErrRefused) || res.Already != 0 || len(res.Fired) != 0 || res.Ticks == 0 {
		t.Fatalf("backfill under a fence above the stream: %+v, %v; want ErrRefused and nothing counted", res, err)
	}
}
