package main

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestCatchupBeyondRetention: entry put and sync refuse a catch-up window
// longer than the activity stream keeps the fired events catch-up reads,
// name both durations and publish nothing.
func TestCatchupBeyondRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("streams", "apply", "--activity-max-age", "2h")
	refused := func(msg string) {
		t.Helper()
		for _, want := range []string{"catch-up window", "3h0m0s", "2h0m0s", "--activity-max-age", "nothing was published"} {
			if !strings.Contains(msg, want) {
				t.Errorf("refusal does not say %q:\n%s", want, msg)
			}
		}
	}

	refused(e.fail("entry", "put", "long", "--cron", "@hourly", "--type", "x", "--catchup", "all", "--catchup-window", "3h"))
	if msg := e.fail("entry", "get", "long"); !strings.Contains(msg, "not found") && !strings.Contains(msg, "no entry") {
		t.Errorf("the refused entry exists: %s", msg)
	}
	e.ok("entry", "put", "long", "--cron", "@hourly", "--type", "x", "--catchup", "all", "--catchup-window", "2h")
	refused(e.fail("entry", "put", "long", "--catchup-window", "3h"))
	// Without catch-up the window is not used.
	e.ok("entry", "put", "off", "--cron", "@hourly", "--type", "x", "--catchup", "none", "--catchup-window", "3h")
	refused(e.fail("entry", "put", "off", "--catchup", "latest"))

	file := writeFile(t, "schedules.yaml", `entries:
  - id: synced
    cron: '@hourly'
    task: {type: x}
    catchup: {policy: latest, window: 3h}
`)
	refused(e.fail("sync", "-f", file))
	refused(e.fail("sync", "-f", file, "--dry-run"))
	if msg := e.fail("entry", "get", "synced"); msg == "" {
		t.Error("the refused sync published its entry")
	}

	// An entry written another way (the Go client) is not refused: the
	// replica warns once, and status lists it.
	e = newEnv(t, true)
	e.ok("streams", "apply", "--activity-max-age", "2h")
	client := events.NewClient(e.nats.JetStream(t), events.MustNames(events.DefaultPrefix))
	if _, err := client.Put(context.Background(), events.Entry{ID: "via-client", Cron: "@hourly", Task: events.Task{Type: "x"},
		Catchup: events.Catchup{Policy: events.CatchupAll, Window: events.Duration(3 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	p := start(t, e.vars, "run", "--http", "", "--log-format", "json", "--replica-id", "ret")
	warning := "ticks beyond the activity stream's retention cannot be checked against history"
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(p.Stderr(), warning) }, "no warning:\n%v", lazyStderr{p})
	var st struct {
		Warnings []string `json:"warnings"`
	}
	e.okJSON(&st, "status", "--json")
	if !slices.ContainsFunc(st.Warnings, func(w string) bool {
		return strings.Contains(w, "via-client") && strings.Contains(w, "3h0m0s") && strings.Contains(w, "2h0m0s")
	}) {
		t.Errorf("status warnings do not name the entry and both durations: %q", st.Warnings)
	}
	// A backfill reaching before the retention says its oldest ticks
	// cannot be checked against history.
	out := e.ok("entry", "backfill", "via-client", "--from", "-3h", "--to", "now", "--before-registration")
	if !strings.Contains(out, "older than the activity stream's retention (2h0m0s)") {
		t.Errorf("backfill past the retention does not say so:\n%s", out)
	}
	var bf backfillResult
	e.okJSON(&bf, "entry", "backfill", "via-client", "--from", "-3h", "--to", "now", "--before-registration", "--json")
	if bf.HistoryFrom == nil || time.Since(*bf.HistoryFrom) < 2*time.Hour-time.Minute {
		t.Errorf("backfill --json history_from %v, want two hours ago", bf.HistoryFrom)
	}
	if out := e.ok("entry", "backfill", "via-client", "--from", "-1h", "--to", "now", "--before-registration"); strings.Contains(out, "retention") {
		t.Errorf("backfill within the retention warns:\n%s", out)
	}
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("run exited %d", code)
	}
	if n := strings.Count(p.Stderr(), warning); n != 1 {
		t.Errorf("%d warnings for one entry, want 1:\n%s", n, p.Stderr())
	}
}
