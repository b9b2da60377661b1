package main

import (
	"strings"
	"testing"
)

// TestEntryPauseOnFailureFlag: --pause-on-failure is stored with the entry,
// shown by get, carried by export and read back by sync -f, and
// --pause-on-failure=false turns it off again.
func TestEntryPauseOnFailureFlag(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "pof", "--cron", "@every 1m", "--type", "t", "--pause-on-failure")
	var got map[string]any
	e.okJSON(&got, "entry", "get", "pof", "--json")
	if got["pause_on_failure"] != true {
		t.Fatalf("get --json after --pause-on-failure: %v", got)
	}
	if text := e.ok("entry", "get", "pof"); !strings.Contains(text, "pause_on_failure:") {
		t.Errorf("get text does not show pause_on_failure:\n%s", text)
	}
	var all []map[string]any
	e.okJSON(&all, "entry", "ls", "--json")
	if len(all) != 1 || all[0]["pause_on_failure"] != true {
		t.Errorf("ls --json does not show pause_on_failure: %v", all)
	}
	if exp := e.ok("export"); !strings.Contains(exp, "pause_on_failure: true") {
		t.Errorf("export does not carry pause_on_failure:\n%s", exp)
	}
	// Unchanged by a put of another field.
	e.ok("entry", "put", "pof", "--queue", "q")
	got = nil
	e.okJSON(&got, "entry", "get", "pof", "--json")
	if got["pause_on_failure"] != true {
		t.Fatalf("pause_on_failure lost by a put of another field: %v", got)
	}
	e.ok("entry", "put", "pof", "--pause-on-failure=false")
	got = nil
	e.okJSON(&got, "entry", "get", "pof", "--json")
	if _, ok := got["pause_on_failure"]; ok {
		t.Fatalf("--pause-on-failure=false left it set: %v", got)
	}

	f := writeFile(t, "schedules.yaml", "entries:\n  - id: filed\n    cron: \"@every 1m\"\n    task: {type: t}\n    pause_on_failure: true\n")
	e.ok("sync", "-f", f)
	got = nil
	e.okJSON(&got, "entry", "get", "filed", "--json")
	if got["pause_on_failure"] != true {
		t.Fatalf("sync -f with pause_on_failure: true: %v", got)
	}
}

// TestStatusShowsFailurePauses: status lists the entries paused on failure
// with their note, not those paused by hand.
func TestStatusShowsFailurePauses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "failed", "--cron", "@every 1m", "--type", "t", "--pause-on-failure")
	e.ok("entry", "put", "byhand", "--cron", "@every 1m", "--type", "t")
	note := "paused on failure: task cronstream:failed:2026-12-01T10:00:00Z archived at 2026-12-01T10:00:02Z: boom"
	e.ok("entry", "pause", "failed", "--note", note)
	e.ok("entry", "pause", "byhand", "--note", "maintenance")
	if ls := e.ok("entry", "ls", "-o", "wide"); !strings.Contains(ls, note) {
		t.Errorf("ls -o wide does not show the pause note:\n%s", ls)
	}
	if d := e.ok("entry", "describe", "failed"); !strings.Contains(d, note) || !strings.Contains(d, "pause_on_failure:") {
		t.Errorf("describe does not show pause_on_failure and the pause note:\n%s", d)
	}
	text := e.ok("status")
	if !strings.Contains(text, "paused failed at revision 3") || !strings.Contains(text, note) || strings.Contains(text, "paused byhand") {
		t.Fatalf("status does not list the entry paused on failure (only it):\n%s", text)
	}
}
