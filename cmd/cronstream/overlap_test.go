package main

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/firetest"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
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
		id := schedule.TaskID(prefix, "buf", tick)
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
	want := describeHeld{ScheduledAt: tick1, TaskID: schedule.TaskID(prefix, "buf", tick1), WaitingFor: schedule.TaskID(prefix, "buf", tick0)}
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

// TestOverlapBufferOneThreeReplicas: three `cronstream run` replicas fire
// a buffer-one entry every second whose task (a real asynq v0.26.0 worker)
// takes 2.5 s; one replica is killed with SIGKILL mid-run. Never are two
// tasks of the entry busy at once, every held tick is released within
// 1.25 s of the previous task ending (the owner of the entry's shard
// checks every 250 ms, the worker polls every 50 ms), or, held when the
// owner was killed, within that of the takeover (and across the first
// handovers, not held to the pace), and no tick fires twice.
func TestOverlapBufferOneThreeReplicas(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a 30 s run of three replicas and a real asynq worker")
	}
	e := newEnv(t, true)
	e.ok("entry", "put", "buf", "--cron", "@every 1s", "--type", "buf", "--overlap", "buffer-one")

	var runs firetest.Runs
	opt, err := asynq.ParseRedisURI(e.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 4, TaskCheckInterval: 50 * time.Millisecond,
		Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("buf", func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		runs.Work(ctx, id, 2500*time.Millisecond) // longer than the period
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	replicas := map[string]*proc{}
	for _, id := range []string{"r1", "r2", "r3"} {
		// At debug level the replicas log each tick held and released,
		// which a failure below prints.
		p := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug", "--replica-id", id)
		replicas[id] = p
		testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "replica running") },
			"replica %s did not start:\n%v", id, lazyStderr{p})
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return runs.Ended() >= 2 }, "two tasks of the entry to run")
	// The replicas hand shards over to their desired owners in their
	// first seconds: a tick held across a handover waits for the new
	// owner, as one held across the kill does. The pace is held from here.
	settled := time.Now()
	killedAt := time.Now()
	replicas["r1"].stop(syscall.SIGKILL, 10*time.Second)
	killedAfter := runs.Ended()
	testenv.Eventually(t, 60*time.Second, func() bool { return runs.Ended() >= killedAfter+4 }, "four more tasks after the kill")
	// Paused, the entry fires no more, and the running replicas publish
	// every record left (the killed one's too) before they stop: a replica
	// that stops flushes only the outboxes of the queues it holds.
	pausedAt := time.Now()
	e.ok("entry", "pause", "buf")
	testenv.Eventually(t, 30*time.Second, func() bool {
		out := e.ok("audit", "--json", "--entry", "buf", "--type", "fired")
		for id := range runs.All() {
			if !strings.Contains(out, id) {
				return false
			}
		}
		return true
	}, "a fired event for every task that ran")
	for _, id := range []string{"r2", "r3"} {
		if code := replicas[id].stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			t.Errorf("replica %s exited %d:\n%s", id, code, replicas[id].Stderr())
		}
	}

	// The fired events, from the stream.
	fired := map[string]int{}
	var ticks []time.Time
	testenv.Eventually(t, 30*time.Second, func() bool {
		fired, ticks = map[string]int{}, nil
		for _, l := range strings.Split(e.ok("audit", "--json", "--entry", "buf", "--type", "fired"), "\n") {
			var ev struct {
				Type string       `json:"type"`
				Data events.Fired `json:"data"`
			}
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == events.TypeEntryFired {
				if fired[ev.Data.TaskID]++; fired[ev.Data.TaskID] == 1 {
					ticks = append(ticks, ev.Data.ScheduledAt)
				}
			}
		}
		return len(fired) > 0 && runs.Finished(maps.Keys(fired))
	}, "every fired task to run to its end")

	if n := runs.Overlaps(); n > 0 {
		t.Errorf("%d times two tasks of the entry ran at once", n)
	}
	for id, n := range fired {
		if n != 1 {
			t.Errorf("task %s: %d fired events", id, n)
		}
	}
	ran := runs.All()
	for id, r := range ran {
		if r.Times != 1 {
			t.Errorf("task %s ran %d times", id, r.Times)
		}
		if fired[id] == 0 {
			t.Errorf("task %s ran without a fired event", id)
		}
	}
	slices.SortFunc(ticks, func(x, y time.Time) int { return x.Compare(y) })
	held, slow := 0, false
	for i := 1; i < len(ticks); i++ {
		// Every fired task ran (Finished above).
		prev := ran[schedule.TaskID(events.DefaultPrefix, "buf", ticks[i-1])]
		cur := ran[schedule.TaskID(events.DefaultPrefix, "buf", ticks[i])]
		if !ticks[i].Before(prev.End) {
			continue // fired on time, nothing was busy
		}
		held++
		if prev.End.Before(settled) {
			continue // released across the first handovers
		}
		if prev.End.After(pausedAt.Add(-1250 * time.Millisecond)) {
			continue // released while the pause was applied: not the release check's pace
		}
		// Only the owner of the entry's shard checks: a tick held when
		// the owner is killed waits for the takeover (within the 5 s
		// grace), then for the check's pace.
		by := prev.End.Add(1250 * time.Millisecond)
		if takenOver := killedAt.Add(scheduler.DefaultGrace + 1250*time.Millisecond); by.After(killedAt) && by.Before(takenOver) {
			by = takenOver
		}
		if cur.Start.After(by) {
			t.Errorf("held tick %s started %s after the previous task ended (at %s; r1 killed at %s)", ticks[i].Format(time.TimeOnly),
				cur.Start.Sub(prev.End), prev.End.Format("15:04:05.000"), killedAt.Format("15:04:05.000"))
			slow = true
		}
	}
	if slow {
		for _, id := range slices.Sorted(maps.Keys(replicas)) {
			t.Logf("%s's held ticks, warnings and shard moves:\n%s", id, linesWith(replicas[id].Stderr(), "held", `"WARN"`, "shards", "running"))
		}
	}
	if held < 4 {
		t.Errorf("%d held ticks fired, want at least 4 (ticks %v)", held, ticks)
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
	prefix := events.DefaultPrefix
	tick0 := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	tick1 := tick0.Add(time.Hour)
	firetest.HoldTick(t, e.redis.Client(t), prefix, "can", tick0, tick1)
	id0 := schedule.TaskID(prefix, "can", tick0)

	var v describeView
	e.okJSON(&v, "entry", "describe", "can", "--json")
	if v.Entry.Overlap != events.OverlapCancelPrevious {
		t.Errorf("describe overlap %q", v.Entry.Overlap)
	}
	if v.Held == nil || !v.Held.Cancelling || v.Held.WaitingFor != id0 || v.Held.TaskID != schedule.TaskID(prefix, "can", tick1) {
		t.Errorf("describe held %+v", v.Held)
	}
	if out := e.ok("entry", "describe", "can"); !strings.Contains(out, "held tick (overlap cancel-previous)") {
		t.Errorf("describe text:\n%s", out)
	}
}
