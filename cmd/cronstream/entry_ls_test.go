package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

func TestEntryLsFiltersAndLastFire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	act := &activity{t: t, js: e.nats.JetStream(t), names: events.MustNames("cronstream")}
	e.ok("entry", "put", "inv", "--cron", "@daily", "--type", "invoice:send", "--queue", "billing")
	e.ok("entry", "put", "rep", "--cron", "@hourly", "--type", "report:daily", "--queue", "reports")
	e.ok("entry", "pause", "rep")
	e.ok("sync", "-f", writeFile(t, "s.yaml", "entries:\n  - {id: synced, cron: '@daily', task: {type: invoice:remind}, options: {queue: billing}}\n"), "--owner", "team")

	tick := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	act.publish(act.names.FireSubject("inv"), events.TypeEntryFired, "inv", events.Fired{Entry: "inv", ScheduledAt: tick.Add(-time.Hour), EnqueuedAt: tick, TaskID: "cronstream:inv:1", Queue: "billing", Revision: 1, Replica: "r"})
	act.publish(act.names.FireSubject("inv"), events.TypeEntryFired, "inv", events.Fired{Entry: "inv", ScheduledAt: tick, EnqueuedAt: tick, TaskID: "cronstream:inv:2", Queue: "billing", Revision: 1, Replica: "r"})
	act.publish(act.names.FireSubject("rep"), events.TypeEntrySkipped, "rep", events.Skipped{Entry: "rep", ScheduledAt: tick, Reason: events.SkipOverlap})

	ids := func(args ...string) string {
		var vs []entryView
		e.okJSON(&vs, append([]string{"entry", "ls", "--json"}, args...)...)
		var out []string
		for _, v := range vs {
			out = append(out, v.ID)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "inv,rep,synced"},
		{[]string{"--queue", "billing"}, "inv,synced"},
		{[]string{"--state", "paused"}, "rep"},
		{[]string{"--state", "active", "--queue", "billing"}, "inv,synced"},
		{[]string{"--owner", "team"}, "synced"},
		{[]string{"--owner", ""}, "inv,rep"},
		{[]string{"--type", "invoice:*"}, "inv,synced"},
		{[]string{"--type", "invoice:*", "--owner", "team"}, "synced"},
		{[]string{"--queue", "nowhere"}, ""},
	} {
		if got := ids(tc.args...); got != tc.want {
			t.Errorf("entry ls %v = %s, want %s", tc.args, got, tc.want)
		}
	}

	var vs []entryView
	e.okJSON(&vs, "entry", "ls", "--json")
	if vs[0].LastFire == nil || !vs[0].LastFire.Equal(tick) || vs[0].LastOutcome != "fired" {
		t.Errorf("inv last fire %v %q, want %s fired", vs[0].LastFire, vs[0].LastOutcome, tick)
	}
	if vs[1].LastOutcome != "skipped (overlap)" || vs[2].LastFire != nil {
		t.Errorf("rep %q, synced %v", vs[1].LastOutcome, vs[2].LastFire)
	}
	out := e.ok("entry", "ls")
	if !strings.Contains(out, "LAST FIRE") || !strings.Contains(out, fmtTime(tick)+" skipped (overlap)") {
		t.Errorf("entry ls:\n%s", out)
	}
	if r := e.run("entry", "ls", "--state", "sleeping"); r.code != exitUsage {
		t.Errorf("--state sleeping:\n%s", r)
	}
}

// TestEntryLsSortLimitNamesWatch: --sort-by, --limit, --no-headers, -o name
// (which the bulk commands take back), and --watch printing each change.
func TestEntryLsSortLimitNamesWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "a-daily", "--cron", "@daily", "--type", "t", "--queue", "zq")
	e.ok("entry", "put", "b-minutely", "--cron", "* * * * *", "--type", "t", "--queue", "aq")
	e.ok("entry", "put", "c-hourly", "--cron", "@hourly", "--type", "t", "--queue", "mq")
	e.ok("entry", "pause", "c-hourly")

	if out := e.ok("entry", "ls", "--sort-by", "next-fire", "--no-headers", "-o", "name"); out != "entry/b-minutely\nentry/a-daily\nentry/c-hourly\n" {
		t.Errorf("sorted by next fire (the paused entry, without one, last):\n%s", out)
	}
	if out := e.ok("entry", "ls", "--sort-by", "queue", "-o", "name"); out != "entry/b-minutely\nentry/c-hourly\nentry/a-daily\n" {
		t.Errorf("sorted by queue:\n%s", out)
	}
	r := e.run("entry", "ls", "--limit", "2", "--no-headers")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || strings.Contains(r.stdout, "ID") || !strings.Contains(r.stderr, "and 1 more (--limit 2)") {
		t.Errorf("--limit 2 --no-headers:\n%s", r)
	}
	if strings.Contains(r.stdout, " ago)") || strings.Contains(r.stdout, "(in ") {
		t.Errorf("relative times without a terminal:\n%s", r.stdout)
	}
	// What -o name prints, a bulk command takes back.
	names := strings.Fields(e.ok("entry", "ls", "--state", "paused", "-o", "name"))
	if out := e.ok(append([]string{"entry", "resume"}, names...)...); !strings.Contains(out, "entry c-hourly resumed") {
		t.Errorf("resume entry/c-hourly: %s", out)
	}
	if r := e.run("entry", "ls", "--sort-by", "color"); r.code != exitUsage {
		t.Errorf("--sort-by color:\n%s", r)
	}

	w := start(t, e.vars, "entry", "ls", "--watch", "--queue", "zq", "--no-headers")
	w.line("a-daily", 30*time.Second)
	e.ok("entry", "pause", "a-daily", "--note", "watch me")
	if l := w.line("a-daily", 30*time.Second); !strings.Contains(l, "paused") {
		t.Errorf("watch after a pause: %q", l)
	}
	e.ok("entry", "put", "b-minutely", "--cron", "@hourly") // another queue: not shown
	e.ok("entry", "rm", "a-daily")
	if l := w.line("a-daily", 30*time.Second); !strings.Contains(l, "removed") {
		t.Errorf("watch after a removal: %q", l)
	}
	if strings.Contains(w.Stdout(), "b-minutely") {
		t.Errorf("watch of queue zq showed an entry of another queue:\n%s", w.Stdout())
	}
	if code := w.stop(syscall.SIGINT, 10*time.Second); code != 0 {
		t.Errorf("entry ls --watch exit %d on SIGINT\n%s", code, w.Stderr())
	}
}
