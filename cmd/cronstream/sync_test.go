package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

const schedules = `
entries:
  - id: daily-report
    cron: "0 9 * * *"
    timezone: Europe/Berlin
    task:
      type: report:daily
      payload: {team: ops}
      headers: {source: cron}
    options: {queue: reports, max_retry: 5, timeout: 10m, retention: 24h}
    catchup: {policy: latest, window: 1h}
    overlap: skip
    jitter: 30s
  - id: cleanup
    cron: "@every 15m"
    task: {type: cleanup}
`

type syncJSON struct {
	DryRun  bool `json:"dry_run"`
	Actions []struct {
		Kind        string   `json:"kind"`
		ID          string   `json:"id"`
		NewRevision uint64   `json:"new_revision"`
		Changes     []string `json:"changes"`
		Error       string   `json:"error"`
	} `json:"actions"`
	Unchanged []string `json:"unchanged"`
	NotPruned []string `json:"not_pruned"`
}

func TestSync(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	file := writeFile(t, "schedules.yaml", schedules)

	// Dry run before anything exists: a plan, nothing published (not even
	// the streams).
	out := e.ok("sync", "-f", file, "--dry-run")
	for _, want := range []string{"+ cleanup", "+ daily-report", "2 to create", "dry run: nothing published"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if msg := e.fail("entry", "ls"); !strings.Contains(msg, "does not exist") {
		t.Errorf("a dry run created the streams: %s", msg)
	}

	var rep syncJSON
	e.okJSON(&rep, "sync", "-f", file, "--json")
	if len(rep.Actions) != 2 || rep.Actions[0].Kind != "create" || rep.Actions[0].NewRevision == 0 || rep.DryRun {
		t.Fatalf("first sync: %+v", rep)
	}
	var got entryJSON
	e.okJSON(&got, "entry", "get", "daily-report", "--json")
	if got.Owner != "sync" || got.Options.Queue != "reports" || got.payload(t) != `{"team":"ops"}` || got.Timezone != "Europe/Berlin" || got.Overlap != "skip" {
		t.Errorf("daily-report as synced: %+v", got)
	}
	// Same file again: nothing published.
	if out := e.ok("sync", "-f", file); !strings.Contains(out, "0 to create, 0 to update, 0 to remove, 2 unchanged") {
		t.Errorf("second sync:\n%s", out)
	}

	// By hand: pause a synced entry, add an entry without owner.
	e.ok("entry", "pause", "cleanup", "--note", "incident 42")
	e.ok("entry", "put", "manual", "--cron", "@daily", "--type", "m")

	// The file drops daily-report and changes cleanup's queue.
	file2 := writeFile(t, "schedules2.yaml", `
entries:
  - id: cleanup
    cron: "@every 15m"
    task: {type: cleanup}
    options: {queue: maintenance}
`)
	out = e.ok("sync", "-f", file2, "--dry-run")
	for _, want := range []string{"~ cleanup", "options.queue: default → maintenance", "--prune removes them", "daily-report"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "- daily-report") || strings.Contains(out, "manual") {
		t.Errorf("dry run without --prune removes:\n%s", out)
	}
	out = e.ok("sync", "-f", file2, "--dry-run", "--prune")
	if !strings.Contains(out, "- daily-report") || strings.Contains(out, "manual") || !strings.Contains(out, "1 to remove") {
		t.Errorf("dry run with --prune:\n%s", out)
	}
	e.okJSON(&got, "entry", "get", "cleanup", "--json")
	if got.Options.Queue != "default" {
		t.Fatalf("a dry run published: %+v", got)
	}

	e.okJSON(&rep, "sync", "-f", file2, "--prune", "--json")
	if len(rep.Actions) != 2 {
		t.Fatalf("sync --prune: %+v", rep)
	}
	if msg := e.fail("entry", "get", "daily-report"); !strings.Contains(msg, "not found") {
		t.Errorf("daily-report not pruned: %s", msg)
	}
	e.ok("entry", "get", "manual") // never pruned: no owner
	e.okJSON(&got, "entry", "get", "cleanup", "--json")
	if got.Options.Queue != "maintenance" || !got.Paused || got.Note != "incident 42" {
		t.Errorf("cleanup after sync: queue %q paused %v note %q; want the new queue and the manual pause kept", got.Options.Queue, got.Paused, got.Note)
	}

	// Another owner prunes nothing of sync's.
	empty := writeFile(t, "empty.yaml", "entries: []\n")
	e.okJSON(&rep, "sync", "-f", empty, "--owner", "team2", "--prune", "--json")
	if len(rep.Actions) != 0 {
		t.Errorf("owner team2 pruned: %+v", rep)
	}

	// The file says paused: false: the entry resumes. JSON files work too.
	jsonFile := writeFile(t, "s.json", `{"entries": [{"id": "cleanup", "cron": "@every 15m", "task": {"type": "cleanup"},
		"options": {"queue": "maintenance"}, "paused": false}]}`)
	e.ok("sync", "-f", jsonFile)
	e.okJSON(&got, "entry", "get", "cleanup", "--json")
	if got.Paused {
		t.Errorf("paused: false in the file did not resume")
	}

	// From stdin.
	if r := e.runIn("entries:\n  - {id: piped, cron: '@daily', task: {type: p}}\n", "sync", "-f", "-"); r.code != 0 {
		t.Fatalf("sync -f -: %s", r)
	}
	e.ok("entry", "get", "piped")
}

func TestSyncRejectsInvalidFileWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "existing", "--cron", "@daily", "--type", "t") // creates the streams
	bad := writeFile(t, "bad.yaml", `
entries:
  - id: good
    cron: "@daily"
    task: {type: g}
  - id: broken
    cron: "0 9 * *"
    task: {type: b}
    options: {timeout: 30}
  - id: typo
    cron: "@daily"
    tsk: {type: t}
  - id: good
    cron: "@hourly"
    task: {type: g}
`)
	msg := e.fail("sync", "-f", bad)
	for _, want := range []string{"5 problems", "entry broken: cron (line 7)", "entry broken: options.timeout (line 9)", "entry typo: tsk (line 12): unknown field",
		"entry typo: task.type", "entry good (line 13): id given twice", "nothing was published"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stderr lacks %q:\n%s", want, msg)
		}
	}
	if msg := e.fail("entry", "get", "good"); !strings.Contains(msg, "not found") {
		t.Errorf("the valid entry of an invalid file was published")
	}
	// A dry run rejects it the same way.
	e.fail("sync", "-f", bad, "--dry-run")
}

func TestSyncWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	file := writeFile(t, "s.yaml", "entries:\n  - {id: w, cron: '@daily', task: {type: t}}\n")
	p := start(t, e.vars, "sync", "-f", file, "--watch", "100ms")
	p.line("w registered", 30*time.Second)
	// The file changes: the next sync publishes it.
	if err := os.WriteFile(file, []byte("entries:\n  - {id: w, cron: '@hourly', task: {type: t}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.line("w updated", 30*time.Second)
	// The file becomes invalid: reported, entries kept, the watch goes on.
	if err := os.WriteFile(file, []byte("entries:\n  - {id: w, cron: 'nope', task: {type: t}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "nothing published") },
		"invalid file not reported by the watch")
	select {
	case <-p.done:
		t.Fatalf("watch exited on an invalid file:\n%s", p.Stderr())
	default:
	}
	var got entryJSON
	e.okJSON(&got, "entry", "get", "w", "--json")
	if got.Cron != "@hourly" {
		t.Errorf("entry changed by an invalid file: %+v", got)
	}
	if code := p.stop(syscall.SIGINT, 10*time.Second); code != 0 {
		t.Errorf("sync --watch exit %d after SIGINT\n%s", code, p.Stderr())
	}
}
