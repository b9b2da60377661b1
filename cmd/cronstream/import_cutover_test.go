package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// asynqEnqueues records every task a real asynq scheduler enqueued, by
// task type, with the scheduler's clock at the enqueue (PostEnqueueFunc
// runs right after it, before asynq records the event).
type asynqEnqueues struct {
	mu    sync.Mutex
	at    map[string][]time.Time
	typed chan string // the type of each enqueue, when someone listens
}

func (a *asynqEnqueues) post(info *asynq.TaskInfo, err error) {
	if err != nil {
		return
	}
	now := time.Now()
	a.mu.Lock()
	a.at[info.Type] = append(a.at[info.Type], now)
	a.mu.Unlock()
	select {
	case a.typed <- info.Type:
	default:
	}
}

// ticks are the ticks of typ asynq enqueued: each enqueue's time, down to
// the tick of a schedule whose ticks are unit apart (asynq enqueues well
// within a second of its tick).
func (a *asynqEnqueues) ticks(typ string, unit time.Duration) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []time.Time
	for _, t := range a.at[typ] {
		out = append(out, t.Truncate(unit).UTC())
	}
	return out
}

// firedTicks records the ticks of cronstream's tasks a real asynq worker
// processed, by entry.
type firedTicks struct {
	mu    sync.Mutex
	ticks map[string][]time.Time
	other int // tasks without a cronstream task id: asynq's
}

func startCountingWorker(t *testing.T, e *cliEnv, queue string) *firedTicks {
	t.Helper()
	f := &firedTicks{ticks: map[string][]time.Time{}}
	srv := asynq.NewServerFromRedisClient(e.redis.Client(t), asynq.Config{
		Concurrency: 8, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel, TaskCheckInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second,
	})
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		f.mu.Lock()
		defer f.mu.Unlock()
		if p, ok := events.ParseTaskID(id); ok {
			f.ticks[p.Entry] = append(f.ticks[p.Entry], p.Tick)
		} else {
			f.other++
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return f
}

func (f *firedTicks) of(entry string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ticks[entry])
}

// TestImportAsynqCutover: real asynq v0.26.0 schedulers tick (one entry
// every minute, registered in both, one every second, one every 3 s)
// when `import asynq --cutover` starts; they are shut down right after a
// minute tick, the moment their Shutdown deletes the enqueue history just
// after recording that tick. Every tick from asynq's first to the
// replica's first minute tick after the cutover is enqueued by exactly one
// side, cronstream's once (the ticks between asynq's stop and the
// registration by the cutover's backfill); the @every 3s entry shifts to
// the epoch's phase without a tick twice or an interval lost. Every task
// is processed by a real asynq worker.
func TestImportAsynqCutover(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for two minute ticks")
	}
	t.Parallel()
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	run := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "cut-1")
	worker := startCountingWorker(t, e, "cut")

	// Start the schedulers in the second half of a minute, so the minute
	// tick comes while the cutover watches.
	for s := time.Now().Second(); s < 40 || s > 48; s = time.Now().Second() {
		testenv.Eventually(t, 70*time.Second, func() bool { return time.Now().Second() != s }, "")
	}
	rec := &asynqEnqueues{at: map[string][]time.Time{}, typed: make(chan string, 100)}
	opts := func() *asynq.SchedulerOpts { return &asynq.SchedulerOpts{PostEnqueueFunc: rec.post} }
	minute := asynqReg{"* * * * *", asynq.NewTask("minute", nil), []asynq.Option{asynq.Queue("cut")}}
	s1, _ := startAsynqScheduler(t, rc, opts(), minute, asynqReg{"@every 1s", asynq.NewTask("second", nil), []asynq.Option{asynq.Queue("cut")}})
	s2, _ := startAsynqScheduler(t, rc, opts(), minute, asynqReg{"@every 3s", asynq.NewTask("three", nil), []asynq.Option{asynq.Queue("cut")}})
	waitListed(t, rc, 2)

	file := t.TempDir() + "/asynq.yaml"
	cut := start(t, e.vars, "import", "asynq", "--cutover", "--cutover-settle", "2s", "--output-file", file)
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(cut.Stderr(), "stop them now") }, "the cutover did not start watching:\n%s", cut.Stderr())
	// Shut both down right after their minute tick's enqueue.
	for len(rec.typed) > 0 {
		<-rec.typed
	}
	for typ := ""; typ != "minute"; {
		select {
		case typ = <-rec.typed:
		case <-time.After(30 * time.Second):
			t.Fatalf("no minute tick:\n%s", cut.Stderr())
		}
	}
	var wg sync.WaitGroup
	for _, s := range []*asynq.Scheduler{s1, s2} {
		wg.Add(1)
		go func() { defer wg.Done(); s.Shutdown() }()
	}
	wg.Wait()
	stopped := time.Now()
	select {
	case <-cut.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the cutover did not finish:\n%s", cut.Stderr())
	}
	if cut.err != nil {
		t.Fatalf("cutover: %v\nstdout:\n%s\nstderr:\n%s", cut.err, cut.Stdout(), cut.Stderr())
	}
	t.Logf("cutover:\n%s%s", cut.Stderr(), cut.Stdout())

	cfgs, err := configsync.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]events.Entry{}
	for _, c := range cfgs {
		ids[c.Entry.Task.Type] = c.Entry
		// The second after asynq's last enqueue, which asynq stamps a
		// moment after PostEnqueueFunc's.
		last := slices.MaxFunc(rec.ticks(c.Entry.Task.Type, time.Second), time.Time.Compare)
		if d := c.Entry.StartAt.Sub(last); d != time.Second && d != 2*time.Second {
			t.Errorf("%s: start_at %s, asynq's last enqueue at %s", c.Entry.ID, c.Entry.StartAt, last)
		}
	}
	if len(ids) != 3 {
		t.Fatalf("entries handed over: %v", ids)
	}
	// The replica's first minute tick after the cutover.
	next := stopped.Truncate(time.Minute).Add(time.Minute)
	testenv.Eventually(t, 90*time.Second, func() bool { return slices.ContainsFunc(worker.of(ids["minute"].ID), next.Equal) }, "no minute tick after the cutover:\n%s", run.Stderr())
	end := next
	// The @every 1s entry's tick of that second too: the worker may take
	// it after the minute's.
	testenv.Eventually(t, 30*time.Second, func() bool { return slices.ContainsFunc(worker.of(ids["second"].ID), end.Equal) },
		"the @every 1s entry's tick %s was not processed:\n%s", end.Format(time.TimeOnly), run.Stderr())

	checkOnce(t, "minute", rec.ticks("minute", time.Minute), worker.of(ids["minute"].ID), time.Minute, end, 2)
	checkOnce(t, "second", rec.ticks("second", time.Second), worker.of(ids["second"].ID), time.Second, end, 1)
	checkPhaseShift(t, rec.ticks("three", time.Second), worker.of(ids["three"].ID), 3*time.Second)
	if code := run.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}
}

// checkOnce: every tick of a schedule with period from asynq's first to
// end was enqueued by exactly one side: by asynq as many times as it has
// schedulers with the registration, or by cronstream once; asynq's come
// first, cronstream's after.
func checkOnce(t *testing.T, name string, asynqTicks, cronTicks []time.Time, period time.Duration, end time.Time, perAsynq int) {
	t.Helper()
	if len(asynqTicks) == 0 || len(cronTicks) == 0 {
		t.Fatalf("%s: %d ticks by asynq, %d by cronstream; want both", name, len(asynqTicks), len(cronTicks))
	}
	count := func(ts []time.Time) map[int64]int {
		m := map[int64]int{}
		for _, t := range ts {
			m[t.Unix()]++
		}
		return m
	}
	a, c := count(asynqTicks), count(cronTicks)
	first := slices.MinFunc(asynqTicks, time.Time.Compare)
	lastAsynq := slices.MaxFunc(asynqTicks, time.Time.Compare)
	var problems []string
	for tick := first; !tick.After(end); tick = tick.Add(period) {
		na, nc := a[tick.Unix()], c[tick.Unix()]
		switch {
		case na == 0 && nc == 1 && tick.After(lastAsynq):
		case nc == 0 && na == perAsynq:
		// asynq's last tick may come while its schedulers stop: those
		// already stopped do not enqueue it, the others do. It is still
		// asynq's alone.
		case nc == 0 && na >= 1 && tick.Equal(lastAsynq):
		default:
			problems = append(problems, fmt.Sprintf("%s: asynq %d, cronstream %d", tick.Format(time.TimeOnly), na, nc))
		}
	}
	for tick, n := range c {
		if tm := time.Unix(tick, 0); tm.Before(first) || tm.After(end) {
			problems = append(problems, fmt.Sprintf("%s: cronstream fired %d outside the window", tm.Format(time.TimeOnly), n))
		}
	}
	if len(problems) > 0 {
		t.Errorf("%s (%s to %s, asynq's last %s): ticks not enqueued exactly once:\n  %s", name, first.Format(time.TimeOnly), end.Format(time.TimeOnly),
			lastAsynq.Format(time.TimeOnly), strings.Join(problems, "\n  "))
	}
}

// checkPhaseShift: an @every entry continues at the epoch's phase: its
// first cronstream tick comes after asynq's last and at most a period
// later, and no tick is fired twice.
func checkPhaseShift(t *testing.T, asynqTicks, cronTicks []time.Time, period time.Duration) {
	t.Helper()
	if len(asynqTicks) == 0 || len(cronTicks) == 0 {
		t.Fatalf("@every %s: %d ticks by asynq, %d by cronstream", period, len(asynqTicks), len(cronTicks))
	}
	last := slices.MaxFunc(asynqTicks, time.Time.Compare)
	slices.SortFunc(cronTicks, time.Time.Compare)
	first := cronTicks[0]
	if !first.After(last) || first.Sub(last) > period {
		t.Errorf("@every %s: asynq's last tick %s, cronstream's first %s", period, last.Format(time.TimeOnly), first.Format(time.TimeOnly))
	}
	for i := 1; i < len(cronTicks); i++ {
		if d := cronTicks[i].Sub(cronTicks[i-1]); d != period {
			t.Errorf("@every %s: cronstream ticks %s and %s", period, cronTicks[i-1].Format(time.TimeOnly), cronTicks[i].Format(time.TimeOnly))
		}
	}
}
