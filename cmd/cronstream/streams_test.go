package main

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/internal/testenv"
)

// activityMaxAge reads the activity stream's max age from the server.
func activityMaxAge(t *testing.T, js jetstream.JetStream) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "CRONSTREAM_ACTIVITY")
	if err != nil {
		t.Fatalf("activity stream: %v", err)
	}
	return s.CachedInfo().Config.MaxAge
}

// TestStreamsApply: the streams change only through `streams apply`; a
// replica with other flags leaves them as they are and warns, in its log
// and in status.
func TestStreamsApply(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	js := e.nats.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A dry run on an empty server says what it would create, and creates
	// nothing.
	out := e.ok("streams", "apply", "--dry-run")
	for _, want := range []string{"CRONSTREAM_CONFIG: missing → created", "CRONSTREAM_ACTIVITY: missing → created", "KV_CRONSTREAM_REPLICAS: missing → created", "nothing changed"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if _, err := js.Stream(ctx, "CRONSTREAM_CONFIG"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("config stream after a dry run: %v, want not found", err)
	}

	// Impossible settings are refused before anything changes.
	if msg := e.fail("streams", "apply", "--activity-max-age", "30m"); !strings.Contains(msg, "activity max age 30m0s is below the duplicate window 1h0m0s") {
		t.Errorf("max age below the duplicate window: %s", msg)
	}
	if msg := e.fail("streams", "apply", "--replicas", "7"); !strings.Contains(msg, "replicas 7") {
		t.Errorf("7 replicas: %s", msg)
	}
	if _, err := js.Stream(ctx, "CRONSTREAM_CONFIG"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("config stream after refused settings: %v, want not found", err)
	}

	e.ok("streams", "apply")
	if got := activityMaxAge(t, js); got != 720*time.Hour {
		t.Fatalf("activity max age after apply: %s", got)
	}
	if out := e.ok("streams", "apply"); strings.Count(out, "unchanged") != 3 {
		t.Errorf("second apply:\n%s", out)
	}

	// A replica with another --activity-max-age leaves the stream alone
	// and says so.
	p := start(t, e.vars, "run", "--http", "", "--log-format", "json", "--replica-id", "r61", "--activity-max-age", "61m")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica stderr:\n%s", p.Stderr())
		}
	})
	var st struct {
		Replicas []struct {
			ID string `json:"id"`
		} `json:"replicas"`
		Warnings []string `json:"warnings"`
	}
	want := "replica r61: stream CRONSTREAM_ACTIVITY: max_age is 720h0m0s, this replica's flags say 1h1m0s"
	testenv.Eventually(t, 30*time.Second, func() bool {
		e.okJSON(&st, "status", "--json")
		for _, w := range st.Warnings {
			if strings.HasPrefix(w, want) {
				return true
			}
		}
		return false
	}, "status never warned %q", want)
	if v, ok := logValue(p.Stderr(), "stream settings differ from this replica's flags", "stream_value"); !ok || v != "720h0m0s" {
		t.Errorf("replica log has no warning naming the stream's value (%q):\n%s", v, p.Stderr())
	}
	if got := activityMaxAge(t, js); got != 720*time.Hour {
		t.Fatalf("the replica changed the activity max age to %s", got)
	}
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d\n%s", code, p.Stderr())
	}

	// The explicit step: a dry run prints the difference and changes
	// nothing; apply changes it.
	out = e.ok("streams", "apply", "--activity-max-age", "61m", "--dry-run")
	if !strings.Contains(out, "CRONSTREAM_ACTIVITY max_age: 720h0m0s → 1h1m0s") || !strings.Contains(out, "dry run: 1 difference(s), nothing changed") {
		t.Errorf("dry run output:\n%s", out)
	}
	if got := activityMaxAge(t, js); got != 720*time.Hour {
		t.Fatalf("dry run changed the activity max age to %s", got)
	}
	out = e.ok("streams", "apply", "--activity-max-age", "61m")
	if !strings.Contains(out, "CRONSTREAM_ACTIVITY max_age: 720h0m0s → 1h1m0s") || !strings.Contains(out, "applied 1 change(s)") {
		t.Errorf("apply output:\n%s", out)
	}
	if got := activityMaxAge(t, js); got != 61*time.Minute {
		t.Fatalf("activity max age after apply: %s, want 1h1m0s", got)
	}
}
