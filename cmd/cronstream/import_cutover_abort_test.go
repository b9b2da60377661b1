package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// historyLen is how many enqueue events asynq's Inspector lists for an
// asynq entry.
func historyLen(t *testing.T, ins *asynq.Inspector, id string) int {
	t.Helper()
	evs, err := ins.ListSchedulerEnqueueEvents(id, asynq.PageSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// waitReplica waits until status lists replica id as live.
func waitReplica(t *testing.T, e *cliEnv, p *proc, id string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() bool {
		r := e.run("status")
		return r.code == 0 && strings.Contains(r.stdout, id)
	}, "replica %s not live:\n%s", id, p.Stderr())
}

// TestImportAsynqCutoverAborts: a cutover that cannot vouch for the ticks
// registers nothing and leaves asynq's history as it was: interrupted, or
// when an asynq scheduler starts while it watches. Entries that already
// exist in cronstream, and a time zone that does not fit asynq's next
// run, are refused before it watches.
func TestImportAsynqCutoverAborts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	ins := inspector(t, e.redis.URL)
	waitReplica(t, e, start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "abort-1"), "abort-1")
	_, ids := startAsynqScheduler(t, rc, nil, asynqReg{"@every 1s", asynq.NewTask("tick", nil), []asynq.Option{asynq.Queue("abort")}})
	waitListed(t, rc, 1)
	testenv.Eventually(t, 10*time.Second, func() bool { return historyLen(t, ins, ids[0]) >= 2 }, "no enqueue history")

	watching := func(p *proc) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "stop them now") }, "the cutover did not start watching:\n%s", p.Stderr())
		if n := historyLen(t, ins, ids[0]); n != 0 {
			t.Fatalf("asynq's history holds %d events while the cutover captures it", n)
		}
	}
	nothingRegistered := func(p *proc, why string) {
		t.Helper()
		if !strings.Contains(p.Stderr(), "nothing was registered") || !strings.Contains(p.Stderr(), why) {
			t.Errorf("aborted cutover's stderr lacks %q:\n%s", why, p.Stderr())
		}
		if out := e.ok("entry", "ls"); strings.Contains(out, "tick-") {
			t.Errorf("an aborted cutover registered entries:\n%s", out)
		}
		// The scheduler still runs: its history is back, and grows.
		n := historyLen(t, ins, ids[0])
		testenv.Eventually(t, 10*time.Second, func() bool { return historyLen(t, ins, ids[0]) > n && n >= 2 }, "history not restored (%d events)", n)
	}

	// Interrupted.
	p := start(t, e.vars, "import", "asynq", "--cutover")
	watching(p)
	if code := p.stop(syscall.SIGINT, 20*time.Second); code != 1 {
		t.Fatalf("interrupted cutover exited %d:\n%s", code, p.Stderr())
	}
	nothingRegistered(p, "interrupted")

	// A scheduler starts while it watches.
	p = start(t, e.vars, "import", "asynq", "--cutover")
	watching(p)
	startAsynqScheduler(t, rc, nil, asynqReg{"@hourly", asynq.NewTask("other", nil), nil})
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the cutover did not notice the new scheduler:\n%s", p.Stderr())
	}
	nothingRegistered(p, "started during the cutover")

	// Already in cronstream: refused before anything is captured.
	file := t.TempDir() + "/pre.yaml"
	r := e.run("import", "asynq", "--output-file", file)
	if r.code != 0 {
		t.Fatal(r)
	}
	e.ok("sync", "-f", file)
	if r := e.run("import", "asynq", "--cutover"); r.code != 1 || !strings.Contains(r.stderr, "already registered in cronstream:") || !strings.Contains(r.stderr, "tick-") {
		t.Fatalf("cutover of registered entries:\n%s", r)
	}
}

// TestImportAsynqCutoverZone: an entry whose time zone does not fit the
// next run its scheduler listed is refused before the cutover watches, and
// so is a cutover with no replica running.
func TestImportAsynqCutoverZone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	startAsynqScheduler(t, rc, &asynq.SchedulerOpts{Location: tokyo}, asynqReg{spec: "30 6 * * *", task: asynq.NewTask("wake", nil)})
	waitListed(t, rc, 1)
	r := e.run("import", "asynq", "--cutover")
	if r.code != 1 || !strings.Contains(r.stderr, "time zone does not fit") || strings.Contains(r.stderr, "stop them now") {
		t.Fatalf("cutover in the wrong zone:\n%s", r)
	}
	// In the right zone, but no replica runs to fire the entries after it.
	r = e.run("import", "asynq", "--cutover", "--timezone", "Asia/Tokyo")
	if r.code != 1 || !strings.Contains(r.stderr, "no cronstream replica runs") || strings.Contains(r.stderr, "stop them now") {
		t.Fatalf("cutover without replicas:\n%s", r)
	}
}

// TestImportAsynqCutoverKilledScheduler: a scheduler that stops beating
// without shutting down (killed: its list expires instead of being
// cleared) ends the wait all the same; its entries start after the
// enqueue it recorded last, the cutover warns that an enqueue in flight
// when it died may be repeated, and its history is put back as asynq
// would have left it. The dead scheduler is what asynq writes, written by
// taskstate's writers (checked against asynq's Inspector elsewhere).
func TestImportAsynqCutoverKilledScheduler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	rc := e.redis.Client(t)
	ctx := context.Background()
	store := taskstate.New(rc)
	waitReplica(t, e, start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "killed-1"), "killed-1")
	const sched, entry = "web-3:4242:6f1c2a9e-0000-4000-8000-000000000001", "5b1f2f60-0000-4000-8000-000000000002"
	last := time.Now().Add(-30 * time.Second).Truncate(time.Minute).Add(2 * time.Millisecond)
	for _, at := range []time.Time{last.Add(-time.Minute), last} {
		if err := store.RecordSchedulerEnqueueEvent(ctx, entry, taskstate.SchedulerEnqueueEvent{TaskID: "uuid-" + at.Format("1504"), EnqueueTime: at}); err != nil {
			t.Fatal(err)
		}
	}
	se := taskstate.SchedulerEntry{ID: entry, Spec: "* * * * *", TaskType: "minute", EnqueueOptions: []string{`Queue("killed")`},
		Next: last.Truncate(time.Minute).Add(time.Minute), Prev: last.Truncate(time.Minute)}
	if err := store.WriteSchedulerEntries(ctx, sched, []taskstate.SchedulerEntry{se}, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	file := t.TempDir() + "/killed.yaml"
	p := start(t, e.vars, "import", "asynq", "--cutover", "--cutover-settle", "1s", "--output-file", file)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the cutover did not end after the list expired:\n%s", p.Stderr())
	}
	if p.err != nil || !strings.Contains(p.Stderr(), "gone without shutting down") || !strings.Contains(p.Stderr(), "may be enqueued twice") {
		t.Fatalf("cutover of a killed scheduler: %v\n%s", p.err, p.Stderr())
	}
	cfgs, err := configsync.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfgs) != 1 || !cfgs[0].Entry.StartAt.Equal(last.Truncate(time.Second).Add(time.Second).UTC()) {
		t.Fatalf("handed over: %+v; want start_at the second after %s", cfgs, last)
	}
	evs, _, err := store.SchedulerHistory(ctx, entry)
	if err != nil || len(evs) != 2 {
		t.Fatalf("history of the killed scheduler after the cutover: %d events, %v; want both back", len(evs), err)
	}
	// Registered: the replicas fire it from the next minute on.
	var got entryJSON
	e.okJSON(&got, "entry", "get", cfgs[0].Entry.ID, "--json")
	if got.Owner != "sync" || got.Options.Queue != "killed" {
		t.Fatalf("registered as %+v", got)
	}
	// The file written says what was registered: syncing it changes nothing.
	if out := e.ok("sync", "-f", file); !strings.Contains(out, "1 unchanged") {
		t.Fatalf("syncing the cutover's file:\n%s", out)
	}
}
