package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/internal/asynqconv"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// startAsynqScheduler starts a real asynq v0.26.0 scheduler with the
// registrations regs (spec, task, options) and returns it with the entry
// ids asynq gave them. It is shut down at cleanup unless the test did.
func startAsynqScheduler(t *testing.T, rc redis.UniversalClient, opts *asynq.SchedulerOpts, regs ...asynqReg) (*asynq.Scheduler, []string) {
	t.Helper()
	if opts == nil {
		opts = &asynq.SchedulerOpts{}
	}
	// Its list's TTL is two heartbeats in whole seconds: a second keeps
	// the test quick.
	opts.HeartbeatInterval, opts.LogLevel = time.Second, asynq.FatalLevel
	s := asynq.NewSchedulerFromRedisClient(rc, opts)
	var ids []string
	for _, r := range regs {
		id, err := s.Register(r.spec, r.task, r.opts...)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown) // a second Shutdown does nothing
	return s, ids
}

type asynqReg struct {
	spec string
	task *asynq.Task
	opts []asynq.Option
}

// waitListed waits until n asynq schedulers list their entries.
func waitListed(t *testing.T, rc redis.UniversalClient, n int) {
	t.Helper()
	store := taskstate.New(rc)
	testenv.Eventually(t, 10*time.Second, func() bool {
		ls, err := store.ListSchedulers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, l := range ls {
			if l.Exists && len(l.Entries) > 0 && !taskstate.IsOwnSchedulerID(l.ID) {
				got++
			}
		}
		return got >= n
	}, "%d asynq schedulers did not list their entries", n)
}

// TestImportAsynq: the entries of two running asynq schedulers, read from
// Redis into a schedules file: identical registrations merged, cronstream's
// own list left out, an option it cannot carry refused (or left out), a
// time zone that does not fit asynq's next run named. Synced with sync -f,
// the entries fire into Redis, and an import beside the replica that
// fires them leaves out the entries it lists.
func TestImportAsynq(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	ctx := context.Background()
	daily := asynqReg{"0 9 * * MON-FRI", asynq.NewTask("report:daily", []byte(`{"team":"ops"}`)),
		[]asynq.Option{asynq.Queue("reports"), asynq.MaxRetry(5), asynq.Timeout(10 * time.Minute), asynq.Retention(24 * time.Hour)}}
	ping := asynqReg{"@every 2s", asynq.NewTask("ping", nil), []asynq.Option{asynq.Queue("fast"), asynq.MaxRetry(1)}}
	late := asynqReg{"@hourly", asynq.NewTask("late", nil), []asynq.Option{asynq.ProcessIn(time.Minute)}}
	startAsynqScheduler(t, rc, nil, daily, ping)
	startAsynqScheduler(t, rc, nil, daily, late)
	// cronstream's own list, as a replica writes it for asynq's tools.
	if err := taskstate.New(rc).WriteSchedulerEntries(ctx, taskstate.SchedulerID("cronstream"),
		[]taskstate.SchedulerEntry{{ID: "ours", Spec: "@daily", TaskType: "ours"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitListed(t, rc, 2)

	// An unsupported option fails the import and writes nothing.
	r := e.run("import", "asynq")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "ProcessIn(1m0s)") || !strings.Contains(r.stderr, "nothing was written") {
		t.Fatalf("import with an unsupported option:\n%s", r)
	}

	file := t.TempDir() + "/asynq.yaml"
	r = e.run("import", "asynq", "--skip-unsupported", "--output-file", file)
	if r.code != 0 {
		t.Fatalf("import:\n%s", r)
	}
	cfgs, err := configsync.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]asynqReg{}
	for _, reg := range []asynqReg{daily, ping} {
		var opts []string
		for _, o := range reg.opts {
			opts = append(opts, o.String())
		}
		ent, err := asynqconv.Registration{Spec: reg.spec, Type: reg.task.Type(), Payload: reg.task.Payload(), Options: opts}.Entry()
		if err != nil {
			t.Fatal(err)
		}
		want[ent.ID] = reg
	}
	if len(cfgs) != 2 {
		t.Fatalf("%d entries imported, want the two asynq registrations (daily merged, ours left out):\n%s", len(cfgs), readFile(t, file))
	}
	for _, c := range cfgs {
		reg, ok := want[c.Entry.ID]
		if !ok || c.Entry.Cron != reg.spec || c.Entry.Task.Type != reg.task.Type() || c.Owner != nil || c.Paused != nil || c.Entry.Timezone != "UTC" {
			t.Errorf("imported %+v (owner %v, paused %v): not an asynq registration's id and fields", c.Entry, c.Owner, c.Paused)
		}
	}
	for _, w := range []string{"late left out (--skip-unsupported)", "from 2 schedulers", "does not store the task's headers", "evaluated in UTC", "imported 2 entries from 2 asynq schedulers"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
		}
	}

	// Synced and fired by a replica: ping lands in its queue with its
	// options.
	e.ok("sync", "-f", file)
	if out := e.ok("sync", "-f", file); !strings.Contains(out, "2 unchanged") {
		t.Errorf("syncing the import again changed something:\n%s", out)
	}
	p := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "import-1")
	ins := inspector(t, e.redis.URL)
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, task := range pendingTasks(t, ins, "fast") {
			if strings.HasPrefix(task.ID, "cronstream:ping-") && task.Type == "ping" && task.MaxRetry == 1 {
				return true
			}
		}
		return false
	}, "the imported entry did not fire:\n%s", p.Stderr())
	// The replica lists the entries it holds under its own scheduler id;
	// importing again leaves them out.
	store, own := taskstate.New(rc), taskstate.ReplicaSchedulerID("cronstream", "import-1")
	testenv.Eventually(t, 20*time.Second, func() bool {
		ls, err := store.ListSchedulers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(ls, func(l taskstate.ListedScheduler) bool { return l.ID == own && l.Exists && len(l.Entries) == 2 })
	}, "the replica did not list its entries under %s", own)
	r = e.run("import", "asynq", "--skip-unsupported")
	if r.code != 0 || strings.Count(r.stdout, "cron:") != 2 || strings.Contains(r.stdout, "import-1") || strings.Contains(r.stderr, "import-1") ||
		!strings.Contains(r.stderr, "imported 2 entries from 2 asynq schedulers") {
		t.Fatalf("import beside a replica that lists its entries:\n%s", r)
	}
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}
}

// TestImportAsynqTimezone: a scheduler in another zone than the import's
// is named; --timezone with its zone imports it without the warning.
func TestImportAsynqTimezone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	startAsynqScheduler(t, rc, &asynq.SchedulerOpts{Location: ny}, asynqReg{spec: "0 9 * * *", task: asynq.NewTask("wake", nil)})
	waitListed(t, rc, 1)
	r := e.run("import", "asynq")
	if r.code != 0 || !strings.Contains(r.stderr, "is not a tick of \"0 9 * * *\" in UTC") || !strings.Contains(r.stdout, "timezone: UTC") {
		t.Fatalf("import in the wrong zone:\n%s", r)
	}
	r = e.run("import", "asynq", "--timezone", "America/New_York")
	if r.code != 0 || strings.Contains(r.stderr, "not a tick") || strings.Contains(r.stderr, "evaluated in UTC") || !strings.Contains(r.stdout, "timezone: America/New_York") {
		t.Fatalf("import with --timezone:\n%s", r)
	}
	if r := e.run("import", "asynq", "--timezone", "Mars/Olympus"); r.code != exitUsage {
		t.Fatalf("bad --timezone: %s", r)
	}
	// No running scheduler: a clear error.
	empty := newEnv(t, true)
	if r := empty.run("import", "asynq"); r.code != 1 || !strings.Contains(r.stderr, "no running asynq scheduler found") {
		t.Fatalf("import without schedulers:\n%s", r)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
