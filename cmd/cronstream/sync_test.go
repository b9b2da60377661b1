package main

import (
	"fmt"
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

// TestSyncPruneGuardRails: a prune that changes more than --max-changes
// entries without a terminal is refused unless --yes; a watch whose file is
// emptied by mistake keeps the entries; long lists are summarised.
func TestSyncPruneGuardRails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	var b strings.Builder
	b.WriteString("entries:\n")
	for i := range 30 {
		fmt.Fprintf(&b, "  - {id: g%02d, cron: '@daily', task: {type: t}}\n", i)
	}
	all := writeFile(t, "all.yaml", b.String())
	e.ok("sync", "-f", all) // no prune: no guard
	one := writeFile(t, "one.yaml", "entries:\n  - {id: g00, cron: '@daily', task: {type: t}}\n")

	// Without --prune the 29 others are kept, and said in one short line.
	out := e.ok("sync", "-f", one, "--dry-run")
	if !strings.Contains(out, "g01, g02") || !strings.Contains(out, "and 19 more") {
		t.Errorf("kept entries not summarised:\n%s", out)
	}
	r := e.run("sync", "-f", one, "--prune", "--max-changes", "10")
	if r.code != exitUsage || !strings.Contains(r.stderr, "would apply 29 changes, more than --max-changes 10") {
		t.Errorf("prune over --max-changes:\n%s", r)
	}
	if out := e.ok("entry", "ls", "-o", "name"); strings.Count(out, "\n") != 30 {
		t.Errorf("a refused prune removed entries:\n%s", out)
	}

	// A watch whose file loses its entries keeps them.
	file := writeFile(t, "watched.yaml", b.String())
	p := start(t, e.vars, "sync", "-f", file, "--prune", "--watch", "100ms", "--max-changes", "5")
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "watching") }, "no watch")
	if err := os.WriteFile(file, []byte("entries: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), "removes more entries than allowed") },
		"an emptied file's prune not refused:\n%s", lazyStderr{p})
	if out := e.ok("entry", "ls", "-o", "name"); strings.Count(out, "\n") != 30 {
		t.Errorf("the watch pruned an emptied file's entries:\n%s", out)
	}
	if code := p.stop(syscall.SIGINT, 10*time.Second); code != 0 {
		t.Errorf("sync --watch exit %d after SIGINT\n%s", code, p.Stderr())
	}

	// --yes goes ahead.
	if out := e.ok("sync", "-f", one, "--prune", "--max-changes", "10", "--yes"); !strings.Contains(out, "29 to remove") {
		t.Errorf("prune --yes:\n%s", out)
	}
	if out := e.ok("entry", "ls", "-o", "name"); out != "entry/g00\n" {
		t.Errorf("after prune --yes:\n%s", out)
	}
}

// TestSyncWarnsOfJitterOverGap: sync says, as entry put does, when entries
// it writes have a jitter longer than the gap between two of their fires:
// one entry by name with the gap, many in one summarised line, on stderr
// and in --json; an entry within its gap is not named.
func TestSyncWarnsOfJitterOverGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	one := writeFile(t, "one.yaml", `
entries:
  - {id: five, cron: "*/5 * * * *", task: {type: t}, jitter: 1h}
  - {id: calm, cron: "*/5 * * * *", task: {type: t}, jitter: 4m}
`)
	r := e.run("sync", "-f", one, "--dry-run")
	if r.code != 0 || !strings.Contains(r.stderr, "warning: five: jitter 1h is longer than the 5m between two fires") || strings.Contains(r.stderr, "calm") {
		t.Errorf("one entry's jitter over its gap:\n%s", r)
	}
	var b strings.Builder
	b.WriteString("entries:\n")
	for i := range 8 {
		fmt.Fprintf(&b, "  - {id: j%d, cron: \"@every 1m\", task: {type: t}, jitter: 2m}\n", i)
	}
	many := writeFile(t, "many.yaml", b.String())
	var rep struct {
		Warnings []string `json:"warnings"`
	}
	e.okJSON(&rep, "sync", "-f", many, "--json")
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "8 entries have a jitter longer than the shortest gap") || !strings.Contains(rep.Warnings[0], "and 3 more") {
		t.Errorf("--json warnings of 8 entries over their gap: %q", rep.Warnings)
	}
}
