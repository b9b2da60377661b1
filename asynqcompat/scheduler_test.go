package asynqcompat_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/asynqcompat"
	"github.com/cronstream/cronstream/events"
)

// TestRegister: a registration becomes the entry asynq would have fired
// (options from NewTask and Register, headers, Location as the zone), under
// an id that a new Scheduler (a restarted process) derives again without
// publishing anything; an operator's pause survives it.
func TestRegister(t *testing.T) {
	_, js, c := natsEnv(t, "reg")
	ctx := testCtx(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	opts := &asynqcompat.SchedulerOpts{Prefix: "reg", Location: berlin}
	s1, err := asynqcompat.NewScheduler(js, opts)
	if err != nil {
		t.Fatal(err)
	}
	register := func(s *asynqcompat.Scheduler) string {
		t.Helper()
		task := asynq.NewTaskWithHeaders("report:daily", []byte(`{"team":"ops"}`), map[string]string{"source": "cron"},
			asynq.Queue("ignored"), asynq.Queue("reports"), asynq.MaxRetry(9))
		id, err := s.Register("0 9 * * MON-FRI", task, asynq.MaxRetry(5), asynq.Timeout(10*time.Minute),
			asynqcompat.Deadline(time.Hour), asynq.Unique(30*time.Minute), asynq.Retention(24*time.Hour), asynq.Group("reports"))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	id := register(s1)
	if !strings.HasPrefix(id, "report-daily-") || events.ValidateID(id) != nil {
		t.Fatalf("entry id %q", id)
	}
	e, rev, err := c.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := events.Options{Queue: "reports", Timeout: events.Duration(10 * time.Minute), Deadline: events.Duration(time.Hour),
		Unique: events.Duration(30 * time.Minute), Retention: events.Duration(24 * time.Hour), Group: "reports"}
	got := e.Options
	if got.MaxRetry == nil || *got.MaxRetry != 5 {
		t.Errorf("max retry %v, want 5 (Register's option after NewTask's)", got.MaxRetry)
	}
	got.MaxRetry = nil
	if got != want || e.Timezone != "Europe/Berlin" || e.Owner != asynqcompat.DefaultSchedulerOwner ||
		e.Task.Headers["source"] != "cron" || string(e.Task.Payload) != `{"team":"ops"}` || e.Cron != "0 9 * * MON-FRI" {
		t.Fatalf("entry as registered: %+v", e)
	}

	// An operator pauses it; the program restarts and registers again.
	if _, err := c.Pause(ctx, id, "quarter close"); err != nil {
		t.Fatal(err)
	}
	s2, err := asynqcompat.NewScheduler(js, opts)
	if err != nil {
		t.Fatal(err)
	}
	if again := register(s2); again != id {
		t.Fatalf("a restarted scheduler derived id %q, want %q", again, id)
	}
	e, rev2, err := c.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rev2 != rev+1 || !e.Paused || e.Note != "quarter close" {
		t.Fatalf("after registering again: revision %d (paused at %d), paused %v %q; want nothing published and the pause kept", rev2, rev+1, e.Paused, e.Note)
	}

	// Another option is another registration, as with asynq's manager.
	other, err := s2.Register("0 9 * * MON-FRI", asynq.NewTask("report:daily", []byte(`{"team":"ops"}`)), asynq.Queue("reports"))
	if err != nil || other == id {
		t.Fatalf("other options: id %q (first %q), %v", other, id, err)
	}

	// A named entry keeps its id through a change.
	named := func(spec string) {
		t.Helper()
		got, err := s2.Register(spec, asynq.NewTask("cleanup", nil), asynqcompat.EntryID("nightly-cleanup"),
			asynqcompat.Configure(func(e *events.Entry) {
				e.Catchup = events.Catchup{Policy: events.CatchupLatest, Window: events.Duration(time.Hour)}
				e.Labels = map[string]string{"team": "ops"}
				e.TickHeaders = true
			}))
		if err != nil || got != "nightly-cleanup" {
			t.Fatalf("EntryID: %q, %v", got, err)
		}
	}
	named("0 3 * * *")
	named("0 4 * * *")
	e, _, err = c.Get(ctx, "nightly-cleanup")
	if err != nil || e.Cron != "0 4 * * *" || e.Catchup.Policy != events.CatchupLatest || e.Labels["team"] != "ops" || !e.TickHeaders {
		t.Fatalf("named entry: %+v, %v", e, err)
	}
	if n := len(listed(t, c)); n != 3 {
		t.Fatalf("%d entries, want 3", n)
	}
}

// TestRegisterRefuses: what cannot become an entry is an error naming the
// cause, and nothing is published.
func TestRegisterRefuses(t *testing.T) {
	_, js, c := natsEnv(t, "refuse")
	s, err := asynqcompat.NewScheduler(js, &asynqcompat.SchedulerOpts{Prefix: "refuse"})
	if err != nil {
		t.Fatal(err)
	}
	task := asynq.NewTask("t", nil)
	at := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name  string
		spec  string
		task  *asynq.Task
		opts  []asynq.Option
		is    error
		names string
	}{
		{name: "TaskID", spec: "@daily", task: task, opts: []asynq.Option{asynq.TaskID("fixed")}, is: asynqcompat.ErrUnsupportedOption, names: `TaskID("fixed")`},
		{name: "ProcessAt", spec: "@daily", task: task, opts: []asynq.Option{asynq.ProcessAt(at)}, is: asynqcompat.ErrUnsupportedOption, names: "ProcessAt("},
		{name: "ProcessIn", spec: "@daily", task: task, opts: []asynq.Option{asynq.ProcessIn(time.Minute)}, is: asynqcompat.ErrUnsupportedOption, names: "ProcessIn(1m0s)"},
		{name: "absolute Deadline", spec: "@daily", task: task, opts: []asynq.Option{asynq.Deadline(at)}, is: asynqcompat.ErrUnsupportedOption, names: "Deadline("},
		{name: "TaskID given to NewTask", spec: "@daily", task: asynq.NewTask("t", nil, asynq.TaskID("x")), is: asynqcompat.ErrUnsupportedOption, names: `TaskID("x")`},
		{name: "blank queue", spec: "@daily", task: task, opts: []asynq.Option{asynq.Queue("")}, is: asynqcompat.ErrInvalidOption, names: `Queue("")`},
		{name: "short unique", spec: "@daily", task: task, opts: []asynq.Option{asynq.Unique(time.Millisecond)}, is: asynqcompat.ErrInvalidOption, names: "Unique(1ms)"},
		{name: "bad spec", spec: "61 * * * *", task: task, is: events.ErrInvalidEntry, names: "cron"},
		{name: "@every asynq rounds", spec: "@every 1500ms", task: task, names: `asynq runs it as "@every 1s"`},
		{name: "blank type", spec: "@daily", task: asynq.NewTask(" ", nil), is: events.ErrInvalidEntry, names: "task.type"},
		{name: "nil task", spec: "@daily", names: "task is nil"},
		{name: "Configure changes the task", spec: "@daily", task: task,
			opts: []asynq.Option{asynqcompat.Configure(func(e *events.Entry) { e.Task.Type = "other" })}, names: "Configure changed"},
		{name: "reserved header with tick_headers", spec: "@daily", task: asynq.NewTaskWithHeaders("t", nil, map[string]string{"Cronstream-Entry": "x"}),
			opts: []asynq.Option{asynqcompat.Configure(func(e *events.Entry) { e.TickHeaders = true })}, is: events.ErrInvalidEntry, names: "reserved"},
		{name: "bad entry id", spec: "@daily", task: task, opts: []asynq.Option{asynqcompat.EntryID("a.b")}, is: events.ErrInvalidEntry, names: "id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			id, err := s.Register(c.spec, c.task, c.opts...)
			if err == nil {
				t.Fatalf("registered as %q", id)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.names) {
				t.Errorf("error %q does not name %q", err, c.names)
			}
		})
	}
	if n := len(listed(t, c)); n != 0 {
		t.Fatalf("%d entries published by refused registrations", n)
	}

	for _, loc := range []*time.Location{time.Local, time.FixedZone("X", 3600)} {
		if _, err := asynqcompat.NewScheduler(js, &asynqcompat.SchedulerOpts{Location: loc}); err == nil {
			t.Errorf("Location %s accepted", loc)
		}
	}
}

// TestUnregister removes the scheduler owner's entries only.
func TestUnregister(t *testing.T) {
	_, js, c := natsEnv(t, "unreg")
	ctx := testCtx(t)
	s, err := asynqcompat.NewScheduler(js, &asynqcompat.SchedulerOpts{Prefix: "unreg", Owner: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Register("@every 10s", asynq.NewTask("invoice:send", nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, events.Entry{ID: "by-hand", Cron: "@daily", Task: events.Task{Type: "x"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Unregister("by-hand"); err == nil || !strings.Contains(err.Error(), `owner ""`) {
		t.Fatalf("unregistering another owner's entry: %v", err)
	}
	if err := s.Unregister(id); err != nil {
		t.Fatal(err)
	}
	if err := s.Unregister(id); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("unregistering twice: %v, want ErrNotFound", err)
	}
	if got := listed(t, c); len(got) != 1 || got["by-hand"].ID == "" {
		t.Fatalf("entries after unregister: %v", got)
	}
	// Shutdown removes nothing; a stopped scheduler does not start again.
	id2, err := s.Register("@every 10s", asynq.NewTask("invoice:send", nil))
	if err != nil || id2 != id {
		t.Fatalf("registered again: %q, %v", id2, err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		t.Fatal("started twice")
	}
	s.Shutdown()
	if err := s.Start(); err == nil {
		t.Fatal("started after shutdown")
	}
	if got := listed(t, c); got[id].ID == "" {
		t.Fatal("Shutdown removed the entry")
	}
	if err := s.Ping(); err != nil {
		t.Fatal(err)
	}
}
