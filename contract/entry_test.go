package contract

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestValidateEntry(t *testing.T) {
	t.Parallel()
	with := func(f func(*Entry)) Entry {
		e := validEntry("job")
		f(&e)
		return e
	}
	manyHeaders := map[string]string{}
	for i := range 65 {
		manyHeaders[fmt.Sprintf("h%d", i)] = "v"
	}
	cases := []struct {
		name   string
		entry  Entry
		fields []string // nil: valid
	}{
		// Good entries.
		{"minimal", validEntry("job"), nil},
		{"every field set", fullEntry(), nil},
		{"seconds field", with(func(e *Entry) { e.Cron = "*/10 * * * * *" }), nil},
		{"descriptor", with(func(e *Entry) { e.Cron = "@daily" }), nil},
		{"every", with(func(e *Entry) { e.Cron = "@every 90s" }), nil},
		{"CRON_TZ prefix", with(func(e *Entry) { e.Cron = "CRON_TZ=Asia/Tokyo 0 9 * * *" }), nil},
		{"timezone", with(func(e *Entry) { e.Timezone = "America/New_York" }), nil},
		{"catch-up all", with(func(e *Entry) { e.Catchup = Catchup{Policy: CatchupAll, Window: Duration(6 * time.Hour)} }), nil},
		{"catch-up latest, default window", with(func(e *Entry) { e.Catchup.Policy = CatchupLatest }), nil},
		{"payload of exactly 1 MiB", with(func(e *Entry) { e.Task.Payload = make([]byte, MaxPayloadBytes) }), nil},
		{"id of 128 characters", with(func(e *Entry) { e.ID = strings.Repeat("a", 128) }), nil},
		{"id of every allowed class", with(func(e *Entry) { e.ID = "A-z_0-9" }), nil},
		{"max_retry 0", with(func(e *Entry) { e.Options.MaxRetry = ptr(0) }), nil},
		{"queue with spaces and unicode", with(func(e *Entry) { e.Options.Queue = "critical jobs é.*>" }), nil},
		{"deadline without timeout", with(func(e *Entry) { e.Options.Deadline = Duration(time.Hour) }), nil},
		{"paused with note", with(func(e *Entry) { e.Paused, e.Note = true, "freeze" }), nil},
		{"jitter of 24h", with(func(e *Entry) { e.Jitter = Duration(24 * time.Hour) }), nil},

		// Bad entries: each names its field.
		{"empty id", with(func(e *Entry) { e.ID = "" }), []string{"id"}},
		{"id with a dot", with(func(e *Entry) { e.ID = "a.b" }), []string{"id"}},
		{"id with a wildcard", with(func(e *Entry) { e.ID = "a*" }), []string{"id"}},
		{"id with a space", with(func(e *Entry) { e.ID = "a b" }), []string{"id"}},
		{"id of 129 characters", with(func(e *Entry) { e.ID = strings.Repeat("a", 129) }), []string{"id"}},
		{"id with unicode", with(func(e *Entry) { e.ID = "täglich" }), []string{"id"}},
		{"no cron", with(func(e *Entry) { e.Cron = "" }), []string{"cron"}},
		{"cron with three fields", with(func(e *Entry) { e.Cron = "* * *" }), []string{"cron"}},
		{"minute 61", with(func(e *Entry) { e.Cron = "61 * * * *" }), []string{"cron"}},
		{"cron with surrounding space", with(func(e *Entry) { e.Cron = " * * * * *" }), []string{"cron"}},
		{"unknown descriptor", with(func(e *Entry) { e.Cron = "@fortnightly" }), []string{"cron"}},
		{"every zero", with(func(e *Entry) { e.Cron = "@every 0s" }), []string{"cron"}},
		{"every fraction of a second", with(func(e *Entry) { e.Cron = "@every 1500ms" }), []string{"cron"}},
		{"CRON_TZ unknown zone", with(func(e *Entry) { e.Cron = "CRON_TZ=Mars/Olympus 0 9 * * *" }), []string{"cron"}},
		{"unknown timezone", with(func(e *Entry) { e.Timezone = "Mars/Olympus" }), []string{"timezone"}},
		{"host's Local zone", with(func(e *Entry) { e.Timezone = "Local" }), []string{"timezone"}},
		{"CRON_TZ=Local", with(func(e *Entry) { e.Cron = "CRON_TZ=Local 0 9 * * *" }), []string{"cron"}},
		{"TZ=Local", with(func(e *Entry) { e.Cron = "TZ=Local 0 9 * * *" }), []string{"cron"}},
		{"no task type", with(func(e *Entry) { e.Task.Type = "" }), []string{"task.type"}},
		{"blank task type", with(func(e *Entry) { e.Task.Type = " \t" }), []string{"task.type"}},
		{"task type not UTF-8", with(func(e *Entry) { e.Task.Type = "a\xff" }), []string{"task.type"}},
		{"payload over 1 MiB", with(func(e *Entry) { e.Task.Payload = make([]byte, MaxPayloadBytes+1) }), []string{"task.payload"}},
		{"empty header name", with(func(e *Entry) { e.Task.Headers = map[string]string{"": "v"} }), []string{"task.headers"}},
		{"65 headers", with(func(e *Entry) { e.Task.Headers = manyHeaders }), []string{"task.headers"}},
		{"queue starting with }", with(func(e *Entry) { e.Options.Queue = "}q" }), []string{"options.queue"}},
		{"queue of 257 bytes", with(func(e *Entry) { e.Options.Queue = strings.Repeat("q", 257) }), []string{"options.queue"}},
		{"queue not UTF-8", with(func(e *Entry) { e.Options.Queue = "\xfe" }), []string{"options.queue"}},
		{"negative max_retry", with(func(e *Entry) { e.Options.MaxRetry = ptr(-1) }), []string{"options.max_retry"}},
		{"negative timeout", with(func(e *Entry) { e.Options.Timeout = Duration(-time.Second) }), []string{"options.timeout"}},
		{"timeout under a second", with(func(e *Entry) { e.Options.Timeout = Duration(500 * time.Millisecond) }), []string{"options.timeout"}},
		{"negative deadline", with(func(e *Entry) { e.Options.Deadline = Duration(-time.Hour) }), []string{"options.deadline"}},
		{"unique of 10ms", with(func(e *Entry) { e.Options.Unique = Duration(10 * time.Millisecond) }), []string{"options.unique"}},
		{"negative retention", with(func(e *Entry) { e.Options.Retention = Duration(-time.Hour) }), []string{"options.retention"}},
		{"group not UTF-8", with(func(e *Entry) { e.Options.Group = "\xff" }), []string{"options.group"}},
		{"unknown catch-up policy", with(func(e *Entry) { e.Catchup.Policy = "sometimes" }), []string{"catchup.policy"}},
		{"negative catch-up window", with(func(e *Entry) { e.Catchup = Catchup{Policy: CatchupAll, Window: Duration(-time.Hour)} }), []string{"catchup.window"}},
		{"catch-up window over a year", with(func(e *Entry) { e.Catchup = Catchup{Policy: CatchupAll, Window: Duration(400 * 24 * time.Hour)} }), []string{"catchup.window"}},
		{"unknown overlap policy", with(func(e *Entry) { e.Overlap = "queue" }), []string{"overlap"}},
		{"jitter over 24h", with(func(e *Entry) { e.Jitter = Duration(25 * time.Hour) }), []string{"jitter"}},
		{"negative jitter", with(func(e *Entry) { e.Jitter = Duration(-time.Second) }), []string{"jitter"}},
		{"note over 1 KiB", with(func(e *Entry) { e.Note = strings.Repeat("n", 1025) }), []string{"note"}},
		{"owner over 128 bytes", with(func(e *Entry) { e.Owner = strings.Repeat("o", 129) }), []string{"owner"}},
		{"several problems at once", with(func(e *Entry) { e.ID, e.Cron, e.Overlap = "a b", "nope", "x" }), []string{"id", "cron", "overlap"}},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.entry.Validate()
			if tc.fields == nil {
				if err != nil {
					t.Fatalf("valid entry refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("invalid entry accepted")
			}
			if !errors.Is(err, ErrInvalidEntry) {
				t.Errorf("%v does not match ErrInvalidEntry", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("%v has no *FieldError", err)
			}
			got := fieldsOf(err)
			slices.Sort(got)
			want := slices.Clone(tc.fields)
			slices.Sort(want)
			if !slices.Equal(slices.Compact(got), want) {
				t.Fatalf("fields %v, want %v (error: %v)", got, want, err)
			}
			for _, f := range tc.fields {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("message %q does not name %s", err, f)
				}
			}
		})
	}
}

func TestNormalizeAndSameContent(t *testing.T) {
	t.Parallel()
	e := validEntry("job")
	n := e.Normalize()
	if n.Timezone != "UTC" || *n.Options.MaxRetry != 25 || n.Options.Queue != "default" || n.Options.Timeout != DefaultTimeout ||
		n.Catchup.Policy != CatchupNone || n.Catchup.Window != 0 || n.Overlap != OverlapAllow {
		t.Fatalf("normalized: %+v", n)
	}
	if n.Normalize().Options.MaxRetry == n.Options.MaxRetry {
		t.Error("Normalize shares the max_retry pointer")
	}
	if !SameContent(e, n) {
		t.Error("an entry and its normalized form differ")
	}
	changed := n.Clone()
	changed.Task.Headers = map[string]string{"a": "b"}
	if SameContent(n, changed) || n.Task.Headers != nil {
		t.Error("Clone shares headers, or a header change is not a change")
	}
	bare := n.Clone()
	bare.Task.Payload = nil
	empty := bare.Clone()
	empty.Task.Payload, empty.Task.Headers = []byte{}, map[string]string{}
	if !SameContent(bare, empty) {
		t.Error("an empty payload or header map counts as a change")
	}
	lat := validEntry("job")
	lat.Catchup.Policy = CatchupLatest
	if got := lat.Normalize().Catchup.Window; got != DefaultCatchupWindow {
		t.Errorf("latest without window normalizes to %s", got)
	}
}
