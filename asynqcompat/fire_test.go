package asynqcompat_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/asynqcompat"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// processed is one task a real asynq worker processed.
type processed struct {
	typ, payload, queue string
	headers             map[string]string
	maxRetry            int
	tick                time.Time
	entry               string
	at                  time.Time
}

// worker is a real asynq v0.26.0 server on queues, recording what it
// processes.
type worker struct {
	mu   sync.Mutex
	done []processed
}

func startWorker(t *testing.T, rd *testenv.Redis, queues ...string) *worker {
	t.Helper()
	w := &worker{}
	qs := map[string]int{}
	for _, q := range queues {
		qs[q] = 1
	}
	srv := asynq.NewServerFromRedisClient(rd.Client(t), asynq.Config{
		Concurrency: 4, Queues: qs, LogLevel: asynq.FatalLevel, TaskCheckInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second,
	})
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		queue, _ := asynq.GetQueueName(ctx)
		retry, _ := asynq.GetMaxRetry(ctx)
		p := processed{typ: task.Type(), payload: string(task.Payload()), queue: queue, headers: task.Headers(), maxRetry: retry, at: time.Now()}
		if f, ok := events.ParseTaskID(id); ok {
			p.entry, p.tick = f.Entry, f.Tick
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = append(w.done, p)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return w
}

// of returns the tasks processed of entry.
func (w *worker) of(entry string) []processed {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []processed
	for _, p := range w.done {
		if p.entry == entry {
			out = append(out, p)
		}
	}
	return out
}

// TestFiredIntoAsynqWorkers: entries registered through the Scheduler and
// the PeriodicTaskManager are fired by two real replicas into Redis and
// processed by a real asynq worker, beside tasks an asynq client enqueues
// into another queue: each tick once, with the task, headers, queue and
// retry count registered. An unregistered entry stops; a manager that shut
// down leaves its entry firing.
func TestFiredIntoAsynqWorkers(t *testing.T) {
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	rc := rd.Client(t)
	names := events.MustNames("fire")
	js := ns.JetStream(t)
	startReplica(t, ns, rc, names, "r1")
	startReplica(t, ns, rc, names, "r2")
	w := startWorker(t, rd, "compat", "other")

	s, err := asynqcompat.NewScheduler(js, &asynqcompat.SchedulerOpts{Prefix: "fire"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Register("@every 1s",
		asynq.NewTaskWithHeaders("compat:a", []byte(`{"n":1}`), map[string]string{"tenant": "acme"}, asynq.Queue("compat")),
		asynq.MaxRetry(2), asynq.Timeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{}
	p.set(nil, cfg("@every 1s", "compat:b", asynq.Queue("compat")))
	m, err := asynqcompat.NewPeriodicTaskManager(asynqcompat.PeriodicTaskManagerOpts{
		PeriodicTaskConfigProvider: p, JetStream: js, SyncInterval: time.Second,
		SchedulerOpts: &asynqcompat.SchedulerOpts{Prefix: "fire", Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	// Tasks of an ordinary asynq client in another queue, all along.
	client := asynq.NewClientFromRedisClient(rc)
	for i := range 5 {
		if _, err := client.Enqueue(asynq.NewTask("plain", []byte{byte(i)}), asynq.Queue("other")); err != nil {
			t.Fatal(err)
		}
	}
	var b string
	for id, e := range listed(t, events.NewClient(js, names)) {
		if e.Task.Type == "compat:b" {
			b = id
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(w.of(a)) >= 3 && len(w.of(b)) >= 3 }, "entries not processed")
	for _, got := range w.of(a) {
		if got.typ != "compat:a" || got.payload != `{"n":1}` || got.queue != "compat" || got.maxRetry != 2 || got.headers["tenant"] != "acme" {
			t.Fatalf("task of the scheduler's entry: %+v", got)
		}
	}
	for _, got := range w.of(b) {
		if got.typ != "compat:b" || got.queue != "compat" || got.maxRetry != 25 {
			t.Fatalf("task of the manager's entry: %+v", got)
		}
	}

	if err := s.Unregister(a); err != nil {
		t.Fatal(err)
	}
	unregistered := time.Now()
	m.Shutdown()
	shut := time.Now()
	// The manager's entry outlives it; the unregistered one fires no tick
	// after its removal (one due at that moment may still have fired).
	testenv.Eventually(t, 15*time.Second, func() bool {
		for _, got := range w.of(b) {
			if got.tick.After(shut.Add(2 * time.Second)) {
				return true
			}
		}
		return false
	}, "the manager's entry stopped firing at Shutdown")
	for _, got := range w.of(a) {
		if got.tick.After(unregistered.Add(time.Second)) {
			t.Fatalf("unregistered entry fired tick %s (unregistered at %s)", got.tick, unregistered)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	plain, ticks := 0, map[string]bool{}
	for _, got := range w.done {
		if got.typ == "plain" {
			plain++
			continue
		}
		k := got.entry + got.tick.String()
		if ticks[k] {
			t.Fatalf("tick %s of %s processed twice", got.tick, got.entry)
		}
		ticks[k] = true
	}
	if plain != 5 {
		t.Fatalf("%d of the other queue's 5 tasks processed", plain)
	}
}
