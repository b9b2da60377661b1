package recoverer_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/recoverer"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestKilledWorkerRecovered: a real asynq v0.26.0 worker process takes
// tasks of two identical queues and is killed with SIGKILL. Our recoverer
// recovers queue "mine"; asynq's own recoverer (a real asynq.Server, whose
// recoverer runs once at start) recovers the twin queue. Both must end in
// the same task states and the same counters; every outcome of ours is one
// event in the activity stream; a second real asynq server then completes
// our retried tasks.
//
// Without -short, our queue's leases really run out (asynq's fixed 30 s
// lease after the last heartbeat, plus our 1 s grace): the test takes ~35 s
// and runs in parallel with the others. With -short, the leases are moved
// into the past instead. The twin's leases are always moved: asynq's
// recoverer needs them 30 s past, and runs only at start or every minute.
func TestKilledWorkerRecovered(t *testing.T) {
	t.Parallel()
	realLease := !testing.Short()
	ctx := context.Background()
	r := testenv.StartRedis(t, testenv.WithPrivateServer()) // the child connects by address
	rc := r.Client(t)
	store := taskstate.New(rc)
	js := startActivity(t)
	client := testenv.AsynqClient(t, rc)
	insp := asynq.NewInspectorFromRedisClient(rc)

	const mine, twin = "mine", "twin"
	const withRetries, atMax = 3, 2 // per queue: MaxRetry(3) tasks, MaxRetry(0) tasks
	for _, q := range []string{mine, twin} {
		for i := range withRetries + atMax {
			maxRetry := 3
			if i >= withRetries {
				maxRetry = 0
			}
			task := asynq.NewTaskWithHeaders("crash", []byte(fmt.Sprintf("p%d", i)), map[string]string{"k": "v"})
			if _, err := client.Enqueue(task, asynq.Queue(q), asynq.MaxRetry(maxRetry), asynq.TaskID(fmt.Sprintf("%s-%d-max%d", q, i, maxRetry))); err != nil {
				t.Fatal(err)
			}
		}
	}
	kill := testenv.StartAsynqChild(t, testenv.AsynqWorker, r.Addr, mine, twin)
	testenv.Eventually(t, 30*time.Second, func() bool {
		a, _ := rc.LLen(ctx, taskstate.Keys(mine).Active()).Result()
		b, _ := rc.LLen(ctx, taskstate.Keys(twin).Active()).Result()
		return a == withRetries+atMax && b == withRetries+atMax
	}, "the child asynq worker takes every task")
	kill()

	pastLeases(t, rc, twin, time.Now().Add(-time.Minute))
	if !realLease {
		pastLeases(t, rc, mine, time.Now().Add(-time.Minute))
	}
	leases, err := rc.ZRangeWithScores(ctx, taskstate.Keys(mine).Lease(), 0, -1).Result()
	if err != nil || len(leases) != withRetries+atMax {
		t.Fatalf("leases of %s: %v %v", mine, leases, err)
	}
	leaseOf := map[string]int64{}
	for _, z := range leases {
		leaseOf[z.Member.(string)] = int64(z.Score)
	}

	// Our recoverer on "mine" only; the relay publishes its records.
	rl := startRelay(t, store, js, "relay1")
	rec := newRecoverer(t, recoverer.Config{Redis: rc, Queues: []string{mine}, OnRecord: rl.Notify}, nil)
	_ = rec.Start(context.Background())
	t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	testenv.Eventually(t, 50*time.Second, func() bool {
		s := rec.Stats()[mine]
		return s.Retried == withRetries && s.Archived == atMax
	}, "our recoverer retries and archives the dead worker's tasks")
	recoveredAt := time.Now()
	_ = rec.Stop(context.Background())

	// asynq's own recoverer on the twin.
	testenv.RecoverWithAsynq(t, rc, twin, 20*time.Second)

	// Task by task: the same state, retried count, error text and headers.
	taskView := func(q string) map[string]string {
		view := map[string]string{}
		for i := range withRetries + atMax {
			maxRetry := 3
			if i >= withRetries {
				maxRetry = 0
			}
			id := fmt.Sprintf("%s-%d-max%d", q, i, maxRetry)
			ti, err := insp.GetTaskInfo(q, id)
			if err != nil {
				t.Fatalf("inspector: task %s: %v", id, err)
			}
			if time.Since(ti.LastFailedAt) > time.Minute {
				t.Errorf("task %s: last failed at %v", id, ti.LastFailedAt)
			}
			view[fmt.Sprintf("%d-max%d", i, maxRetry)] = fmt.Sprintf("%s retried=%d err=%q headers=%v payload=%s",
				ti.State, ti.Retried, ti.LastErr, ti.Headers, ti.Payload)
		}
		return view
	}
	ours, theirs := taskView(mine), taskView(twin)
	if fmt.Sprint(ours) != fmt.Sprint(theirs) {
		t.Fatalf("task states differ\nours  %v\nasynq %v", ours, theirs)
	}
	if want := `retry retried=1 err="asynq: task lease expired" headers=map[k:v] payload=p0`; ours["0-max3"] != want {
		t.Fatalf("retried task: %s\nwant %s", ours["0-max3"], want)
	}
	if want := `archived retried=0 err="asynq: task lease expired" headers=map[k:v] payload=p3`; ours["3-max0"] != want {
		t.Fatalf("archived task: %s\nwant %s", ours["3-max0"], want)
	}
	// asynq's default retry delay for a first failure: 15–44 s.
	for i := range withRetries {
		id := fmt.Sprintf("%s-%d-max3", mine, i)
		ti, _ := insp.GetTaskInfo(mine, id)
		last := ti.LastFailedAt
		if d := ti.NextProcessAt.Sub(last); d < 15*time.Second || d > 45*time.Second {
			t.Errorf("task %s: retry %v after the failure, want asynq's 15-44 s", id, d)
		}
		// Never recovered before lease + grace: LastFailedAt is the pass's
		// now, which was at or after lease + 1 s.
		if last.Unix() < leaseOf[id]+1 {
			t.Errorf("task %s recovered at %d, before its lease %d + grace", id, last.Unix(), leaseOf[id])
		}
	}

	// The queue counters (totals and today's keys, with their TTL) match what
	// asynq's own recoverer produced.
	day := time.Now().UTC()
	for _, key := range []func(taskstate.QueueKeys) string{
		taskstate.QueueKeys.ProcessedTotal, taskstate.QueueKeys.FailedTotal,
		func(k taskstate.QueueKeys) string { return k.Processed(day) },
		func(k taskstate.QueueKeys) string { return k.Failed(day) },
	} {
		ko, kt := key(taskstate.Keys(mine)), key(taskstate.Keys(twin))
		vo, _ := rc.Get(ctx, ko).Result()
		vt, _ := rc.Get(ctx, kt).Result()
		if vo != vt || vo != fmt.Sprint(withRetries+atMax) {
			t.Errorf("%s = %q, asynq's %s = %q, want %d", ko, vo, kt, vt, withRetries+atMax)
		}
		to, _ := rc.TTL(ctx, ko).Result()
		tt, _ := rc.TTL(ctx, kt).Result()
		if d := to - tt; d < -time.Minute || d > time.Minute {
			t.Errorf("%s TTL %v, asynq's %v", ko, to, tt)
		}
	}
	qo, err := insp.GetQueueInfo(mine)
	if err != nil {
		t.Fatal(err)
	}
	qt, err := insp.GetQueueInfo(twin)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprintf("processed=%d/%d failed=%d/%d retry=%d archived=%d active=%d pending=%d",
		qo.Processed, qo.ProcessedTotal, qo.Failed, qo.FailedTotal, qo.Retry, qo.Archived, qo.Active, qo.Pending),
		fmt.Sprintf("processed=%d/%d failed=%d/%d retry=%d archived=%d active=%d pending=%d",
			qt.Processed, qt.ProcessedTotal, qt.Failed, qt.FailedTotal, qt.Retry, qt.Archived, qt.Active, qt.Pending); got != want {
		t.Fatalf("queue info\nours  %s\nasynq %s", got, want)
	}

	// One event per outcome in the activity stream, with docs/design.md's data.
	testenv.Eventually(t, 10*time.Second, func() bool { return activityEventCount(t, js) == withRetries+atMax },
		"the relay publishes one event per recovered task")
	byTask := map[string]streamEvent{}
	for _, se := range activityEvents(t, js) {
		d := recovered(t, se.Event)
		if _, dup := byTask[d.TaskID]; dup {
			t.Fatalf("two events for task %s", d.TaskID)
		}
		byTask[d.TaskID] = se
	}
	for i := range withRetries + atMax {
		maxRetry := 3
		if i >= withRetries {
			maxRetry = 0
		}
		id := fmt.Sprintf("%s-%d-max%d", mine, i, maxRetry)
		se, ok := byTask[id]
		if !ok {
			t.Fatalf("no event for task %s", id)
		}
		ev, d := se.Event, recovered(t, se.Event)
		ti, _ := insp.GetTaskInfo(mine, id)
		if se.Subject != names.RecoverySubject(mine) || se.MsgID != ev.ID || ev.Subject != mine ||
			ev.Source != "cronstream/rep1" || d.Queue != mine || d.Type != "crash" || d.MaxRetry != maxRetry ||
			d.Error != "asynq: task lease expired" || d.Replica != "rep1" || d.Retried != ti.Retried {
			t.Errorf("event of %s: subject %s msg-id %s %+v data %+v", id, se.Subject, se.MsgID, ev, d)
		}
		switch {
		case maxRetry > 0 && (ev.Type != events.TypeTaskRetried || d.RetryAt == nil || !d.RetryAt.Equal(ti.NextProcessAt)):
			t.Errorf("event of %s: %s retry_at %v, task due %v", id, ev.Type, d.RetryAt, ti.NextProcessAt)
		case maxRetry == 0 && (ev.Type != events.TypeTaskArchived || d.RetryAt != nil):
			t.Errorf("event of %s: %s retry_at %v, want archived without retry_at", id, ev.Type, d.RetryAt)
		}
		if ev.Time.Before(recoveredAt.Add(-time.Minute)) || ev.Time.After(recoveredAt.Add(time.Second)) {
			t.Errorf("event of %s: time %v", id, ev.Time)
		}
	}

	// A second real asynq server completes our retried tasks (made due now
	// instead of in 15-44 s).
	for i := range withRetries {
		id := fmt.Sprintf("%s-%d-max3", mine, i)
		if err := rc.ZAddXX(ctx, taskstate.Keys(mine).Retry(), redis.Z{Score: float64(time.Now().Unix() - 1), Member: id}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan string, 2*withRetries)
	testenv.StartAsynqServer(t, rc, asynq.Config{Queues: map[string]int{mine: 1}}, asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		n, _ := asynq.GetRetryCount(ctx)
		done <- fmt.Sprintf("%s retry=%d headers=%v", id, n, task.Headers())
		return nil
	}))
	var got []string
	for range withRetries {
		select {
		case s := <-done:
			got = append(got, s)
		case <-time.After(20 * time.Second):
			t.Fatalf("the second asynq server processed only %v", got)
		}
	}
	sort.Strings(got)
	if want := "mine-0-max3 retry=1 headers=map[k:v],mine-1-max3 retry=1 headers=map[k:v],mine-2-max3 retry=1 headers=map[k:v]"; strings.Join(got, ",") != want {
		t.Fatalf("processed %v\nwant %s", got, want)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		qi, err := insp.GetQueueInfo(mine)
		return err == nil && qi.ProcessedTotal == withRetries+atMax+withRetries && qi.FailedTotal == withRetries+atMax &&
			qi.Retry == 0 && qi.Active == 0 && qi.Archived == atMax
	}, "the retried tasks complete and are counted by asynq")
}
