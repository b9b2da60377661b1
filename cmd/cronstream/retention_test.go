package main

import (
	"strings"
	"testing"
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
	if msg := e.fail("entry", "get", "synced"); msg == "" {
		t.Error("the refused sync published its entry")
	}
}
