package main

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// releaseBeforeScheduleFields is the last release without start_at,
// end_at, exclude and labels: the build a rolling upgrade to these fields
// runs beside.
const releaseBeforeScheduleFields = "fa34a5e"

// TestScheduleFieldsMixedVersions: during a rolling upgrade a replica of the
// release before the schedule fields runs beside one of this build. An
// entry past its end_at, an entry with an exclusion, one with max_fires and
// one with overlap cancel-previous, written by the new
// CLI, are quarantined by the old replica (which would ignore the fields
// and fire them) and handled correctly by the new one; an entry without the
// new fields stays byte-compatible and the old replica fires it alone once
// the new one stops. The old CLI refuses to merge into a gated entry.
func TestScheduleFieldsMixedVersions(t *testing.T) {
	t.Parallel()
	old := buildRelease(t, releaseBeforeScheduleFields)
	e := newEnv(t, true)
	// The streams as the previous release made them: a replica of it
	// refuses a config stream made by this build, which also captures the
	// fail-pause subjects (operations.md, Upgrades).
	oldPut(t, old, e, "plain", "--cron", "@every 1s", "--type", "p")
	e.ok("entry", "put", "ended", "--cron", "@every 1s", "--type", "x", "--end-at", "-1m")
	e.ok("entry", "put", "excl", "--cron", "@every 1s", "--type", "y", "--exclude", "*/2 * * * * *", "--label", "team=payments")
	e.ok("entry", "put", "capped", "--cron", "@every 1s", "--type", "z", "--max-fires", "2")
	e.ok("entry", "put", "canc", "--cron", "@every 1s", "--type", "w", "--overlap", "cancel-previous")

	replica := func(path, id string) *proc {
		t.Helper()
		p := startBin(t, path, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id)
		testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "replica running") },
			"replica %s did not start:\n%v", id, lazyStderr{p})
		return p
	}
	type event struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	activity := func() (fired []events.Fired, skipped []events.Skipped) {
		t.Helper()
		for _, l := range strings.Split(e.ok("audit", "--json", "--type", "fired,skipped"), "\n") {
			var ev event
			if json.Unmarshal([]byte(l), &ev) != nil {
				continue
			}
			switch ev.Type {
			case events.TypeEntryFired:
				var f events.Fired
				if json.Unmarshal(ev.Data, &f) == nil {
					fired = append(fired, f)
				}
			case events.TypeEntrySkipped:
				var s events.Skipped
				if json.Unmarshal(ev.Data, &s) == nil {
					skipped = append(skipped, s)
				}
			}
		}
		return fired, skipped
	}
	count := func(fired []events.Fired, id string) int {
		return len(slices.DeleteFunc(slices.Clone(fired), func(f events.Fired) bool { return f.Entry != id }))
	}

	o1 := replica(old, "o1")
	n1 := replica(bin, "n1")
	testenv.Eventually(t, 45*time.Second, func() bool {
		fired, _ := activity()
		return count(fired, "plain") >= 4 && count(fired, "excl") >= 3
	}, "plain and excl do not fire with o1 and n1")
	for _, id := range []string{"ended", "excl", "capped", "canc"} {
		if !strings.Contains(o1.Stderr(), `"entry":"`+id+`"`) || !strings.Contains(o1.Stderr(), "entry quarantined") {
			t.Errorf("the old replica did not quarantine %s:\n%s", id, o1.Stderr())
		}
	}
	if strings.Contains(o1.Stderr(), `"entry":"plain"`) {
		t.Errorf("the old replica has a complaint about plain, which uses no new field:\n%s", o1.Stderr())
	}
	if strings.Contains(n1.Stderr(), "entry quarantined") {
		t.Errorf("the new replica quarantined an entry:\n%s", n1.Stderr())
	}
	// The old CLI cannot read a gated entry, so it cannot drop its fields.
	c := exec.Command(old, "entry", "put", "excl", "--payload", "x")
	c.Env = e.vars
	if out, err := c.CombinedOutput(); err == nil || !strings.Contains(string(out), "unknown config event type") {
		t.Errorf("old CLI put on a gated entry: err %v\n%s", err, out)
	}

	// Only the old replica: it fires plain and nothing of the gated
	// entries.
	if code := n1.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("n1 exited %d", code)
	}
	stopped := time.Now()
	before, _ := activity()
	testenv.Eventually(t, 45*time.Second, func() bool {
		fired, _ := activity()
		return count(fired, "plain") >= count(before, "plain")+4
	}, "the old replica does not fire plain alone")
	o1.stop(syscall.SIGTERM, 30*time.Second)

	fired, skipped := activity()
	for _, f := range fired {
		switch {
		case f.Entry == "ended":
			t.Errorf("ended fired tick %s (replica %s)", f.ScheduledAt, f.Replica)
		case (f.Entry == "excl" || f.Entry == "canc") && f.Replica != "n1":
			t.Errorf("excl fired by %s at %s: only the new build may fire it", f.Replica, f.ScheduledAt)
		case f.Entry == "excl" && f.ScheduledAt.Unix()%2 == 0:
			t.Errorf("excl fired excluded tick %s", f.ScheduledAt)
		case f.Entry == "excl" && f.ScheduledAt.After(stopped.Add(time.Second)):
			t.Errorf("excl fired %s after the new replica stopped", f.ScheduledAt)
		}
	}
	if n := count(fired, "capped"); n != 2 || slices.ContainsFunc(fired, func(f events.Fired) bool { return f.Entry == "capped" && f.Replica != "n1" }) {
		t.Errorf("capped (max_fires 2) fired %d ticks, want 2, all by the new replica", n)
	}
	if count(fired, "canc") == 0 {
		t.Error("the new replica never fired canc")
	}
	if !slices.ContainsFunc(fired, func(f events.Fired) bool { return f.Entry == "plain" && f.Replica == "o1" }) {
		t.Error("the old replica never fired plain")
	}
	excluded := 0
	for _, s := range skipped {
		if s.Entry == "excl" && s.Reason == events.SkipExcluded {
			excluded++
		}
	}
	if excluded == 0 {
		t.Errorf("no excluded skip recorded for excl: %+v", skipped)
	}
}

// TestScheduleFieldsCLI: the flags of entry put, their validation errors,
// and how describe, ls (states and --selector), audit, export and sync
// show and select them.
func TestScheduleFieldsCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "pay", "--cron", "0 9 * * 1-5", "--type", "p", "--start-at", "2027-03-01", "--end-at", "2027-04-01T00:00:00Z",
		"--exclude", "* * 25 12 *", "--exclude", "* * 1 1 *", "--label", "team=payments", "--label", "tier=critical")
	e.ok("entry", "put", "ops", "--cron", "@every 1h", "--type", "o", "--label", "team=ops")
	e.ok("entry", "put", "old", "--cron", "@every 1h", "--type", "o", "--end-at", "-1h")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--end-at", "2027-01-01", "--start-at", "2027-02-01"}, "end_at (--end-at)"},
		{[]string{"--exclude", "* * 32 * *"}, "exclude (--exclude)"},
		{[]string{"--exclude", "@every 1h"}, "not a calendar"},
		{[]string{"--label", "bad key=x"}, "key name"},
		{[]string{"--label", "team"}, "key=value"},
		{[]string{"--end-at", "tomorrow"}, "--end-at"},
	} {
		out := e.fail(append([]string{"entry", "put", "bad", "--cron", "@every 1h", "--type", "b"}, c.args...)...)
		if !strings.Contains(out, c.want) {
			t.Errorf("entry put %v: %q does not say %q", c.args, out, c.want)
		}
	}

	desc := e.ok("entry", "describe", "pay")
	for _, want := range []string{"start_at:", "2027-03-01", "end_at:", "2027-04-01", "exclude:", "* * 25 12 *", "labels.team:", "payments"} {
		if !strings.Contains(desc, want) {
			t.Errorf("describe lacks %q:\n%s", want, desc)
		}
	}
	if d := e.ok("entry", "describe", "old"); !strings.Contains(d, "ended") {
		t.Errorf("describe of an entry past its end does not say ended:\n%s", d)
	}
	var views []struct {
		ID     string            `json:"id"`
		State  string            `json:"state"`
		Labels map[string]string `json:"labels"`
		EndAt  string            `json:"end_at"`
	}
	e.okJSON(&views, "entry", "ls", "--json")
	states := map[string]string{}
	for _, v := range views {
		states[v.ID] = v.State
	}
	if states["old"] != "ended" || states["pay"] != "active" || states["ops"] != "active" {
		t.Errorf("states %v", states)
	}
	ids := func(args ...string) string {
		t.Helper()
		var vs []struct {
			ID string `json:"id"`
		}
		e.okJSON(&vs, append([]string{"entry", "ls", "--json"}, args...)...)
		var out []string
		for _, v := range vs {
			out = append(out, v.ID)
		}
		return strings.Join(out, ",")
	}
	for sel, want := range map[string]string{"team=payments": "pay", "team!=payments": "old,ops", "team": "ops,pay", "!team": "old", "team=payments,tier=critical": "pay"} {
		if got := ids("--selector", sel); got != want {
			t.Errorf("entry ls --selector %s: %s, want %s", sel, got, want)
		}
	}
	if got := ids("--state", "ended"); got != "old" {
		t.Errorf("entry ls --state ended: %s", got)
	}
	if out := e.fail("entry", "ls", "--selector", "team=a b"); !strings.Contains(out, "--selector") {
		t.Errorf("bad selector: %s", out)
	}
	if wide := e.ok("entry", "ls", "-o", "wide"); !strings.Contains(wide, "team=payments,tier=critical") || !strings.Contains(wide, "* * 25 12 *; * * 1 1 *") {
		t.Errorf("ls -o wide lacks labels or exclusions:\n%s", wide)
	}

	// The audit stream carries the fields; --selector picks the entries.
	aud := e.ok("audit", "--json", "--selector", "team=payments")
	if !strings.Contains(aud, `"labels":{"team":"payments","tier":"critical"}`) || !strings.Contains(aud, events.TypeEntryRegistered+events.GatedSuffix) ||
		strings.Contains(aud, `"id":"ops"`) || strings.Contains(aud, `"id":"old"`) {
		t.Errorf("audit --selector team=payments:\n%s", aud)
	}
	if out := e.ok("audit", "--type", "registered", "--selector", "team=ops"); !strings.Contains(out, "ops") {
		t.Errorf("audit --type registered does not match the gated type:\n%s", out)
	}

	// export --selector writes only the matching entries, with the
	// fields; sync --selector manages only those.
	exp := e.ok("export", "--selector", "team=payments")
	for _, want := range []string{"id: pay", "start_at: \"2027-03-01T00:00:00Z\"", "end_at:", "exclude:", "labels:", "team: payments"} {
		if !strings.Contains(exp, want) {
			t.Errorf("export lacks %q:\n%s", want, exp)
		}
	}
	if strings.Contains(exp, "id: ops") {
		t.Errorf("export --selector team=payments exported ops:\n%s", exp)
	}
	if out := e.ok("sync", "-f", writeFile(t, "pay.yaml", exp), "--dry-run", "--detailed-exitcode"); !strings.Contains(out, "0 to create, 0 to update, 0 to remove, 1 unchanged") {
		t.Errorf("sync of the export: %s", out)
	}
	file := writeFile(t, "s.yaml", `entries:
  - id: pay2
    cron: "@every 1h"
    task: {type: p}
    labels: {team: payments}
    end_at: 2030-01-01
  - id: ops2
    cron: "@every 1h"
    task: {type: o}
    labels: {team: ops}
`)
	e.ok("sync", "-f", file, "--selector", "team=payments", "--owner", "sync")
	if got := ids("--selector", "team"); got != "ops,pay,pay2" {
		t.Errorf("after sync --selector team=payments: %s, want ops2 left out", got)
	}
	bad := writeFile(t, "bad.yaml", "entries:\n  - id: b\n    cron: \"@every 1h\"\n    task: {type: b}\n    end_at: soon\n    labels: {\"a b\": x}\n")
	if out := e.fail("sync", "-f", bad, "--dry-run"); !strings.Contains(out, "end_at") || !strings.Contains(out, "labels") {
		t.Errorf("sync of bad fields: %s", out)
	}
}
