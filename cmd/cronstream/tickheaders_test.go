package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestTickHeadersCLI: --tick-headers through the command line, the
// schedules file and export; a reserved header name is refused naming
// the flag; the tasks of a triggered entry carry the headers in Redis as
// asynq reads them.
func TestTickHeadersCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	out := e.fail("entry", "put", "bad", "--cron", "@every 1h", "--type", "t", "--tick-headers", "--header", "Cronstream-Entry=x")
	if !strings.Contains(out, "--header") || !strings.Contains(out, "reserved") {
		t.Errorf("a reserved header with --tick-headers: %s", out)
	}
	e.ok("entry", "put", "bare", "--cron", "@every 1h", "--type", "t", "--header", "cronstream-entry=x") // without the option, any name
	e.ok("entry", "put", "th", "--cron", "@every 1h", "--type", "t", "--queue", "th", "--header", "team=ops", "--tick-headers")
	if desc := e.ok("entry", "describe", "th"); !strings.Contains(desc, "tick_headers") {
		t.Errorf("describe does not show tick_headers:\n%s", desc)
	}
	if aud := e.ok("audit", "--json", "--entry", "th"); !strings.Contains(aud, events.TypeEntryRegistered+events.GatedSuffix) || !strings.Contains(aud, `"tick_headers":true`) {
		t.Errorf("audit of th:\n%s", aud)
	}
	exp := e.ok("export")
	if !strings.Contains(exp, "tick_headers: true") {
		t.Errorf("export lacks tick_headers:\n%s", exp)
	}
	if out := e.ok("sync", "-f", writeFile(t, "th.yaml", exp), "--dry-run", "--detailed-exitcode"); !strings.Contains(out, "0 to create, 0 to update, 0 to remove, 2 unchanged") {
		t.Errorf("sync of the export: %s", out)
	}
	// Off again through the file: the entry goes back to the plain types.
	file := writeFile(t, "off.yaml", "entries:\n  - id: th\n    cron: \"@every 1h\"\n    task: {type: t, headers: {team: ops}}\n    options: {queue: th}\n    tick_headers: false\n")
	e.ok("sync", "-f", file)
	if aud := e.ok("audit", "--json", "--entry", "th", "--tail", "1"); !strings.Contains(aud, `"type":"`+events.TypeEntryUpdated+`"`) {
		t.Errorf("turning tick_headers off is not a plain update:\n%s", aud)
	}
	e.ok("entry", "put", "th", "--tick-headers")

	var tr triggerJSON
	e.okJSON(&tr, "entry", "trigger", "th", "--request-id", "r-1", "--json")
	info, err := inspector(t, e.redis.URL).GetTaskInfo("th", tr.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Headers[events.HeaderEntry] != "th" || info.Headers[events.HeaderTrigger] != "r-1" || info.Headers["team"] != "ops" || info.Headers[events.HeaderScheduledAt] == "" {
		t.Errorf("the triggered task's headers, read by asynq's Inspector: %v", info.Headers)
	}
}

// TestNewEntryFormsMixedVersions: during a rolling upgrade a replica of
// the previous release runs beside one of this build. Entries with a
// calendar spec (d#n, and Sunday as 7) and with tick_headers, written by
// the new CLI, are quarantined by the old replica — which cannot apply
// them and so would fire on the wrong days or without the headers — and
// fired by the new one, with the headers; an entry using neither keeps
// firing on both, and on the old one alone once the new one stops.
func TestNewEntryFormsMixedVersions(t *testing.T) {
	t.Parallel()
	old := buildRelease(t, previousRelease)
	e := newEnv(t, true)
	// Today's and tomorrow's weekday and its ordinal in the month (UTC):
	// the spec fires every second whenever the test runs.
	nth := func(d time.Time) string { return fmt.Sprintf("%d#%d", d.Weekday(), (d.Day()-1)/7+1) }
	now := time.Now().UTC()
	// The streams as the old release made them: its replica refuses a
	// config stream that also captures the fail-pause subjects.
	oldPut(t, old, e, "plain", "--cron", "@every 1s", "--type", "p")
	e.ok("entry", "put", "nth", "--cron", "* * * ? * "+nth(now)+","+nth(now.AddDate(0, 0, 1)), "--type", "n")
	e.ok("entry", "put", "sun7", "--cron", "* * * * * 0-7", "--type", "s")
	e.ok("entry", "put", "th", "--cron", "@every 1s", "--type", "h", "--queue", "th", "--tick-headers")
	gated := []string{"nth", "sun7", "th"}

	replica := func(path, id string) *proc {
		t.Helper()
		p := startBin(t, path, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id)
		testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "replica running") },
			"replica %s did not start:\n%v", id, lazyStderr{p})
		return p
	}
	fired := func() []events.Fired {
		t.Helper()
		var out []events.Fired
		for _, l := range strings.Split(e.ok("audit", "--json", "--type", "fired"), "\n") {
			var ev struct {
				Type string       `json:"type"`
				Data events.Fired `json:"data"`
			}
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == events.TypeEntryFired {
				out = append(out, ev.Data)
			}
		}
		return out
	}
	count := func(fs []events.Fired, id, replica string) int {
		n := 0
		for _, f := range fs {
			if f.Entry == id && (replica == "" || f.Replica == replica) {
				n++
			}
		}
		return n
	}

	o1 := replica(old, "o1")
	n1 := replica(bin, "n1")
	testenv.Eventually(t, 45*time.Second, func() bool {
		fs := fired()
		return count(fs, "plain", "") >= 4 && !slices.ContainsFunc(gated, func(id string) bool { return count(fs, id, "n1") < 3 })
	}, "the entries do not fire with o1 and n1")
	for _, id := range gated {
		if !strings.Contains(o1.Stderr(), `"entry":"`+id+`"`) || !strings.Contains(o1.Stderr(), "entry quarantined") {
			t.Errorf("the old replica did not quarantine %s:\n%s", id, o1.Stderr())
		}
	}
	if strings.Contains(o1.Stderr(), `"entry":"plain"`) {
		t.Errorf("the old replica has a complaint about plain, which uses no new form:\n%s", o1.Stderr())
	}
	if strings.Contains(n1.Stderr(), "entry quarantined") {
		t.Errorf("the new replica quarantined an entry:\n%s", n1.Stderr())
	}
	// The old CLI cannot read the option, so it cannot drop it.
	c := exec.Command(old, "entry", "put", "th", "--payload", "x")
	c.Env = e.vars
	if out, err := c.CombinedOutput(); err == nil || !strings.Contains(string(out), `unknown field "tick_headers"`) {
		t.Errorf("old CLI put on a gated entry: err %v\n%s", err, out)
	}

	// Only the old replica: it fires plain and nothing of the others.
	if code := n1.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("n1 exited %d", code)
	}
	before := count(fired(), "plain", "o1")
	testenv.Eventually(t, 45*time.Second, func() bool { return count(fired(), "plain", "o1") >= before+4 },
		"the old replica does not fire plain alone")
	o1.stop(syscall.SIGTERM, 30*time.Second)

	fs := fired()
	for _, f := range fs {
		if slices.Contains(gated, f.Entry) && f.Replica != "n1" {
			t.Errorf("%s tick %s fired by %s: only the new build may fire it", f.Entry, f.ScheduledAt.Format(time.RFC3339), f.Replica)
		}
	}
	// Every task of th in Redis carries its entry and tick, as asynq reads them.
	ins := inspector(t, e.redis.URL)
	tasks := pendingTasks(t, ins, "th")
	if len(tasks) != count(fs, "th", "") || len(tasks) == 0 {
		t.Errorf("%d tasks of th in Redis, %d fired events", len(tasks), count(fs, "th", ""))
	}
	for _, task := range tasks {
		f, ok := events.ParseTaskID(task.ID)
		want := map[string]string{events.HeaderEntry: "th", events.HeaderScheduledAt: events.FormatTaskTick(f.Tick)}
		if !ok || !maps.Equal(task.Headers, want) {
			t.Errorf("task %s: headers %v, want %v", task.ID, task.Headers, want)
		}
	}
}
