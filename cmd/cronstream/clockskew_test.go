package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestClockSkewedReplicas runs a replica whose clock is an hour fast and one
// whose clock is an hour slow beside one whose clock is right, while an
// asynq worker runs a task for longer than asynq's lease (its heartbeat
// extends the lease). All three keep firing, none makes another's fires
// stale, no tick fires twice, and the fast replica's recoverer never takes
// the live task.
func TestClockSkewedReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	replica := func(id, offset string) (*proc, string) {
		t.Helper()
		env := slices.Clone(e.vars)
		if offset != "" {
			env = append(env, "CRONSTREAM_TEST_CLOCK_OFFSET="+offset)
		}
		p := start(t, env, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id)
		var addr string
		testenv.Eventually(t, 30*time.Second, func() bool {
			var ok bool
			addr, ok = logValue(p.Stderr(), "serving http", "addr")
			return ok && strings.Contains(p.Stderr(), "replica running")
		}, "replica %s did not start:\n%v", id, lazyStderr{p})
		return p, "http://" + addr
	}
	fast, fastURL := replica("fast", "1h")
	slow, slowURL := replica("slow", "-1h")
	right, rightURL := replica("right", "")
	urls := map[string]string{"fast": fastURL, "slow": slowURL, "right": rightURL}
	stale := func(url string) int {
		_, body := httpGet(url + "/metrics")
		return seriesValue(body, `cronstream_fire_refused_total{status="stale"}`)
	}

	// Two queues of three entries each: replicas fire into the same slot,
	// whose freshness they share.
	for i := range 6 {
		id := "skew" + strconv.Itoa(i)
		e.ok("entry", "put", id, "--cron", "@every 1s", "--type", "skew", "--queue", "sq"+strconv.Itoa(i%2))
	}

	// A worker runs one task for 20 s; asynq's heartbeat extends its lease
	// meanwhile, so no recoverer may take it.
	opt, err := asynq.ParseRedisURI(e.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	finished := make(chan struct{})
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 1, Queues: map[string]int{"work": 1}, Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("long", func(ctx context.Context, _ *asynq.Task) error {
		if runs.Add(1) > 1 {
			return nil
		}
		defer close(finished)
		select {
		case <-time.After(20 * time.Second): // the work itself, not a wait for a condition
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	client := asynq.NewClient(opt)
	defer client.Close()
	if _, err := client.Enqueue(asynq.NewTask("long", nil), asynq.Queue("work"), asynq.TaskID("long-1"), asynq.MaxRetry(3), asynq.Retention(time.Hour)); err != nil {
		t.Fatal(err)
	}

	// After a warm-up, every replica fires and no stale refusal is added.
	from := time.Now().Add(3 * time.Second)
	testenv.Eventually(t, 30*time.Second, func() bool { return time.Now().After(from) && runs.Load() == 1 }, "the long task did not start")
	staleAt := map[string]int{}
	for id, url := range urls {
		staleAt[id] = stale(url)
	}
	firedBy := func() map[string]int {
		out := map[string]int{}
		for _, l := range strings.Split(e.ok("audit", "--json"), "\n") {
			var ev struct {
				Type string       `json:"type"`
				Data events.Fired `json:"data"`
			}
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == events.TypeEntryFired && ev.Data.ScheduledAt.After(from) {
				out[ev.Data.Replica]++
			}
		}
		return out
	}
	testenv.Eventually(t, 45*time.Second, func() bool {
		f := firedBy()
		return f["fast"] > 0 && f["slow"] > 0 && f["right"] > 0
	}, "the replicas do not all keep firing (fired after warm-up: %v)", lazy(func() string { return fmt.Sprint(firedBy()) }))
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		t.Fatal("the long task did not finish")
	}

	ins := inspector(t, e.redis.URL)
	var ti *asynq.TaskInfo
	testenv.Eventually(t, 10*time.Second, func() bool {
		ti, err = ins.GetTaskInfo("work", "long-1")
		return err == nil && ti.State != asynq.TaskStateActive && ti.State != asynq.TaskStatePending
	}, "the long task is still active or pending (%v)", lazy(func() string { return fmt.Sprint(err) }))
	if ti.State != asynq.TaskStateCompleted || ti.Retried != 0 || runs.Load() != 1 {
		t.Errorf("the long task is %s after %d runs, retried %d: a live lease was recovered", ti.State, runs.Load(), ti.Retried)
	}
	for _, l := range strings.Split(e.ok("audit", "--json"), "\n") {
		var ev struct {
			Type string `json:"type"`
		}
		if json.Unmarshal([]byte(l), &ev) == nil && (ev.Type == events.TypeTaskRetried || ev.Type == events.TypeTaskArchived) {
			t.Errorf("recovery event: %s", l)
		}
	}
	for id, url := range urls {
		if n := stale(url) - staleAt[id]; n > 0 {
			t.Errorf("replica %s: %d fires refused as stale after warm-up", id, n)
		}
	}
	if late, _ := e.statusLate(); len(late) != 0 {
		t.Errorf("late entries with clocks an hour off: %v", late)
	}
	// status on a host whose clock is off shows what the replicas see.
	for _, offset := range []string{"1h", "-1h"} {
		skewed := *e
		skewed.vars = append(slices.Clone(e.vars), "CRONSTREAM_TEST_CLOCK_OFFSET="+offset)
		var st struct {
			Replicas []struct {
				ID      string `json:"id"`
				BeatAge string `json:"beat_age"`
			} `json:"replicas"`
			NextFires []struct {
				Entry string    `json:"entry"`
				Time  time.Time `json:"time"`
			} `json:"next_fires"`
			Late   []json.RawMessage `json:"late"`
			Notes  []string          `json:"notes"`
			Errors []string          `json:"errors"`
		}
		before := time.Now()
		skewed.okJSON(&st, "status", "--json")
		if len(st.Replicas) != 3 || len(st.NextFires) == 0 || len(st.Late) != 0 || len(st.Errors) != 0 {
			t.Errorf("status with its clock %s off: replicas %v, next fires %v, late %s, errors %v", offset, st.Replicas, st.NextFires, st.Late, st.Errors)
		}
		for _, r := range st.Replicas {
			if age, err := time.ParseDuration(r.BeatAge); err != nil || age < 0 || age > 10*time.Second {
				t.Errorf("status with its clock %s off: replica %s's beat is %s old", offset, r.ID, r.BeatAge)
			}
		}
		for _, f := range st.NextFires {
			if f.Time.Before(before.Add(-2*time.Second)) || f.Time.After(time.Now().Add(5*time.Second)) {
				t.Errorf("status with its clock %s off: %s fires next at %s (now %s)", offset, f.Entry, f.Time, time.Now())
			}
		}
		for _, n := range st.Notes {
			if strings.Contains(n, "this host's clock") {
				t.Errorf("status with its clock %s off: note %q", offset, n)
			}
		}
	}
	t.Logf("fired after warm-up by replica: %v", firedBy())
	for _, p := range []*proc{fast, slow, right} {
		if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			t.Errorf("run exited %d", code)
		}
	}
	checkQueuesFiredOnce(t, e, ins, "sq0", "sq1")
}

// checkQueuesFiredOnce checks that each entry's fired events name distinct
// ticks and tasks, and that the queues hold exactly the fired tasks.
func checkQueuesFiredOnce(t *testing.T, e *cliEnv, ins *asynq.Inspector, queues ...string) {
	t.Helper()
	ticks := map[string]map[int64]bool{}
	tasks := map[string]string{} // task id → queue
	for _, l := range strings.Split(strings.TrimSpace(e.ok("audit", "--json")), "\n") {
		var ev struct {
			Type string       `json:"type"`
			Data events.Fired `json:"data"`
		}
		if json.Unmarshal([]byte(l), &ev) != nil || ev.Type != events.TypeEntryFired {
			continue
		}
		f := ev.Data
		if ticks[f.Entry] == nil {
			ticks[f.Entry] = map[int64]bool{}
		}
		if _, dup := tasks[f.TaskID]; dup || ticks[f.Entry][f.ScheduledAt.Unix()] {
			t.Errorf("%s: tick %s fired twice (task %s)", f.Entry, f.ScheduledAt, f.TaskID)
		}
		ticks[f.Entry][f.ScheduledAt.Unix()], tasks[f.TaskID] = true, f.Queue
	}
	held := 0
	for _, q := range queues {
		for _, ti := range pendingTasks(t, ins, q) {
			held++
			if tasks[ti.ID] != q {
				t.Errorf("task %s in queue %s has no fired event in that queue", ti.ID, q)
			}
		}
	}
	if held != len(tasks) {
		t.Errorf("%d tasks in queues %v, %d fired events", held, queues, len(tasks))
	}
	for entry, ts := range ticks {
		t.Logf("%s: %d ticks fired once each", entry, len(ts))
	}
}
