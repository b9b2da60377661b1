package asynqcompat_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/asynqcompat"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// provider is an asynq.PeriodicTaskConfigProvider whose configs the test
// changes, counting the polls.
type provider struct {
	mu    sync.Mutex
	cfgs  []*asynq.PeriodicTaskConfig
	err   error
	polls int
}

func (p *provider) GetConfigs() ([]*asynq.PeriodicTaskConfig, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.polls++
	return p.cfgs, p.err
}

func (p *provider) set(err error, cfgs ...*asynq.PeriodicTaskConfig) {
	p.mu.Lock()
	p.cfgs, p.err = cfgs, err
	p.mu.Unlock()
}

// pollsAfter waits until the provider was asked n more times than now, so
// a poll that saw the last set has finished its sync.
func (p *provider) pollsAfter(t *testing.T, n int) {
	t.Helper()
	p.mu.Lock()
	want := p.polls + n
	p.mu.Unlock()
	testenv.Eventually(t, 10*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.polls >= want
	}, "the manager did not poll %d times", n)
}

func cfg(spec, typ string, opts ...asynq.Option) *asynq.PeriodicTaskConfig {
	return &asynq.PeriodicTaskConfig{Cronspec: spec, Task: asynq.NewTask(typ, nil), Opts: opts}
}

// TestManager: the manager keeps its owner's entries equal to the
// provider's configs, pruning its stale entries at start and on every
// poll; a bad set or a provider error keeps them; Shutdown removes none.
func TestManager(t *testing.T) {
	_, js, c := natsEnv(t, "mgr")
	ctx := testCtx(t)
	// Left from an earlier run of the program (same owner), by hand (no
	// owner) and by another program.
	for _, e := range []events.Entry{
		{ID: "stale", Owner: "billing-jobs"},
		{ID: "by-hand"},
		{ID: "other-program", Owner: "reports-jobs"},
	} {
		e.Cron, e.Task = "@daily", events.Task{Type: "x"}
		if _, err := c.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	p := &provider{}
	invoice := cfg("0 * * * *", "invoice:send", asynq.Queue("billing"))
	dunning := cfg("30 8 * * *", "dunning:run", asynq.MaxRetry(3))
	p.set(nil, invoice, dunning, cfg("0 * * * *", "invoice:send", asynq.Queue("billing"))) // the same registration twice
	m, err := asynqcompat.NewPeriodicTaskManager(asynqcompat.PeriodicTaskManagerOpts{
		PeriodicTaskConfigProvider: p, JetStream: js, SyncInterval: 100 * time.Millisecond,
		SchedulerOpts: &asynqcompat.SchedulerOpts{Prefix: "mgr", Owner: "billing-jobs", Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Shutdown)
	ids := func() []string { return slices.Sorted(maps.Keys(listed(t, c))) }
	got := ids()
	if len(got) != 4 || !slices.Contains(got, "by-hand") || !slices.Contains(got, "other-program") || slices.Contains(got, "stale") {
		t.Fatalf("after start: %v; want the two configs, by-hand and other-program, not stale", got)
	}
	entries := listed(t, c)
	var invoiceID string
	for id, e := range entries {
		if e.Task.Type == "invoice:send" {
			invoiceID = id
			if e.Options.Queue != "billing" || e.Owner != "billing-jobs" {
				t.Errorf("invoice entry: %+v", e)
			}
		}
	}

	// The provider changes: invoice's payload (another registration),
	// dunning gone, a new one.
	p.set(nil, &asynq.PeriodicTaskConfig{Cronspec: "0 * * * *", Task: asynq.NewTask("invoice:send", []byte("v2")), Opts: []asynq.Option{asynq.Queue("billing")}},
		cfg("@every 1h", "reminder"))
	p.pollsAfter(t, 2)
	got = ids()
	if len(got) != 4 || slices.Contains(got, invoiceID) {
		t.Fatalf("after the change: %v; want the two new configs beside by-hand and other-program", got)
	}
	before := listed(t, c)

	// A set with a config it cannot carry, and a provider error, keep the
	// entries as they are.
	p.set(nil, cfg("@every 1h", "reminder"), cfg("@daily", "late", asynq.ProcessIn(time.Hour)))
	p.pollsAfter(t, 2)
	p.set(errors.New("database down"))
	p.pollsAfter(t, 2)
	if after := listed(t, c); !maps.EqualFunc(before, after, events.SameContent) {
		t.Fatalf("a refused poll changed the entries:\nbefore %v\nafter %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}

	// An operator's pause survives the polls.
	p.set(nil, cfg("@every 1h", "reminder"))
	p.pollsAfter(t, 2)
	var reminder string
	for id, e := range listed(t, c) {
		if e.Task.Type == "reminder" {
			reminder = id
		}
	}
	if _, err := c.Pause(ctx, reminder, "holiday"); err != nil {
		t.Fatal(err)
	}
	p.pollsAfter(t, 2)
	if e, _, err := c.Get(ctx, reminder); err != nil || !e.Paused {
		t.Fatalf("pause not kept: %+v %v", e, err)
	}

	m.Shutdown()
	p.mu.Lock()
	polls := p.polls
	p.mu.Unlock()
	if e := listed(t, c); e[reminder].ID == "" {
		t.Fatal("Shutdown removed the manager's entry")
	}
	// Three intervals: a poll after Shutdown would show.
	stopped := time.Now()
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Since(stopped) > 300*time.Millisecond }, "")
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.polls != polls {
		t.Fatalf("polled after Shutdown")
	}
}

// TestManagerStartFails as asynq's does when its first sync cannot be made.
func TestManagerStartFails(t *testing.T) {
	_, js, c := natsEnv(t, "mgrfail")
	for _, tc := range []struct {
		name string
		p    *provider
		want string
	}{
		{name: "provider error", p: &provider{err: errors.New("db down")}, want: "db down"},
		{name: "unsupported option", p: &provider{cfgs: []*asynq.PeriodicTaskConfig{cfg("@daily", "a"), cfg("@daily", "b", asynq.TaskID("x"))}}, want: `TaskID("x")`},
		{name: "nil task", p: &provider{cfgs: []*asynq.PeriodicTaskConfig{{Cronspec: "@daily"}}}, want: "Task cannot be nil"},
		{name: "empty spec", p: &provider{cfgs: []*asynq.PeriodicTaskConfig{{Task: asynq.NewTask("a", nil)}}}, want: "Cronspec cannot be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := asynqcompat.NewPeriodicTaskManager(asynqcompat.PeriodicTaskManagerOpts{
				PeriodicTaskConfigProvider: tc.p, JetStream: js, SchedulerOpts: &asynqcompat.SchedulerOpts{Prefix: "mgrfail", Logger: quiet},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Shutdown()
			if err := m.Start(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if n := len(listed(t, c)); n != 0 {
		t.Fatalf("%d entries published", n)
	}
	if _, err := asynqcompat.NewPeriodicTaskManager(asynqcompat.PeriodicTaskManagerOpts{JetStream: js}); err == nil {
		t.Fatal("no provider accepted")
	}
}
