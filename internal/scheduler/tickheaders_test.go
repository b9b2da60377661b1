package scheduler_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestTickHeadersReadByAsynqWorker: a real asynq worker reads, with
// task.Headers(), the entry and the tick of every task of an entry with
// tick_headers, whichever way it was fired: plain ticks of several entries
// due at one instant (the script's bulk path), ticks held by buffer-one
// and by cancel-previous and released later (with their own tick, not the
// release's), a trigger (its request id) and a backfill; the entry's own
// headers come along, and an entry without the option gets none of ours.
func TestTickHeadersReadByAsynqWorker(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a run of several seconds with a real asynq worker")
	}
	e := newEnv(t)
	tick := func(en *events.Entry) {
		en.TickHeaders = true
		en.Task.Headers = map[string]string{"team": "ops"}
	}
	plain := []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	for _, id := range plain {
		e.put(every(id, "@every 1s", tick))
	}
	e.put(every("bare", "@every 1s", func(en *events.Entry) { en.Task.Headers = map[string]string{"team": "ops"} }))
	e.put(every("buf", "@every 1s", tick, func(en *events.Entry) { en.Overlap = events.OverlapBufferOne }))
	e.put(every("can", "@every 1s", tick, func(en *events.Entry) { en.Overlap = events.OverlapCancelPrevious }))
	e.put(every("man", "@every 1h", tick))

	var (
		mu      sync.Mutex
		seen    = map[string]map[string]string{} // task id → headers as the handler read them
		started = map[string]time.Time{}         // task id → when the handler began
	)
	startWorker(t, e, 8, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		seen[id], started[id] = maps.Clone(task.Headers()), time.Now()
		mu.Unlock()
		switch task.Type() {
		case "tick:buf": // longer than the period: the next tick is held
			select {
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
			}
		case "tick:can": // runs until cancelled
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	// heldBuf counts buf's tasks that ran a second or more after their
	// tick: held while the task before ran, then released.
	heldBuf := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for id, at := range started {
			if f, ok := events.ParseTaskID(id); ok && f.Entry == "buf" && at.Sub(f.Tick) >= time.Second {
				n++
			}
		}
		return n
	}
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 45*time.Second, func() bool {
		st := a.counts()
		return heldBuf() >= 2 && st.CancelDeleted >= 2 && st.Fired >= 30
	}, "held ticks of buf and can released and plain ticks fired")

	m := scheduler.Manual{Redis: e.rc, JS: e.js, Names: testNames, Source: "cronstream/test"}
	c := testenv.Context(t, 30*time.Second)
	target, err := m.Load(c, "man")
	if err != nil {
		t.Fatal(err)
	}
	trigID, created, err := m.Trigger(c, target, "deploy-7")
	if err != nil || !created {
		t.Fatalf("trigger: %v", err)
	}
	hour := time.Now().Add(-2 * time.Hour).Truncate(time.Hour)
	bf, err := m.Backfill(c, target, hour, hour)
	if err != nil || len(bf.Fired) != 1 {
		t.Fatalf("backfill: %+v %v", bf, err)
	}
	a.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	acts := e.readActivity()
	var fired []events.Fired
	for _, ac := range acts {
		if ac.Type == events.TypeEntryFired {
			fired = append(fired, ac.Fired)
		}
	}
	headersOf := func(taskID string) map[string]string {
		var h map[string]string
		testenv.Eventually(t, 20*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			var ok bool
			h, ok = seen[taskID]
			return ok
		}, "the worker to process task %s", taskID)
		return h
	}
	// A task of can still waiting when its next tick fired was deleted by
	// that fire (its cancelled event says so): no worker ever ran it.
	deletedWaiting := map[string]bool{}
	for _, ac := range acts {
		if ac.Type == events.TypeTaskCancelled && ac.Cancelled.Action == events.CancelDeleted {
			deletedWaiting[ac.Cancelled.TaskID] = true
		}
	}
	released := map[string]int{}
	for _, f := range fired {
		if deletedWaiting[f.TaskID] {
			continue
		}
		h := headersOf(f.TaskID)
		if h["team"] != "ops" {
			t.Errorf("task %s: the entry's own header is gone: %v", f.TaskID, h)
		}
		if f.Entry == "bare" {
			for k := range h {
				if k != "team" {
					t.Errorf("task %s of an entry without tick_headers carries %s", f.TaskID, k)
				}
			}
			continue
		}
		want := map[string]string{"team": "ops", events.HeaderEntry: f.Entry, events.HeaderScheduledAt: events.FormatTaskTick(f.ScheduledAt)}
		switch {
		case f.Trigger != "":
			want[events.HeaderTrigger] = f.Trigger
		case f.Backfill:
			want[events.HeaderBackfill] = "true"
		}
		if !maps.Equal(h, want) {
			t.Errorf("task %s (%+v): headers %v, want %v", f.TaskID, f, h, want)
		}
	}
	released["buf"] = heldBuf()
	for _, ac := range acts {
		// A tick held for a running task, cancelled, then fired.
		if ac.Type == events.TypeTaskCancelled && ac.Cancelled.Action == events.CancelRequested && ledgers(acts)["can"].taskIDs[ac.Cancelled.ReplacedBy] > 0 {
			released["can"]++
		}
	}
	if released["buf"] < 2 || released["can"] < 2 {
		t.Errorf("released held ticks checked: %v, want at least 2 of buf and of can", released)
	}
	if h := headersOf(trigID); h[events.HeaderTrigger] != "deploy-7" {
		t.Errorf("trigger task headers %v", h)
	}
	if h := headersOf(bf.Fired[0]); h[events.HeaderBackfill] != "true" || h[events.HeaderScheduledAt] != events.FormatTaskTick(hour) {
		t.Errorf("backfilled task headers %v", h)
	}
	for _, id := range plain {
		if n := len(ledgers(acts)[id].taskIDs); n < 3 {
			t.Errorf("%s fired %d ticks, want at least 3", id, n)
		}
	}
}
