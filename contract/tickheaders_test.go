package contract

import (
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
)

// TestTickHeadersValidate: with tick_headers, a task header in the
// reserved prefix (any case) is refused naming the header and why; without
// the option any name stays valid, as it was before the option existed.
func TestTickHeadersValidate(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"cronstream-entry", "Cronstream-Scheduled-At", "CRONSTREAM-x", "cronstream-"} {
		e := validEntry("th")
		e.TickHeaders = true
		e.Task.Headers = map[string]string{name: "x", "team": "ops"}
		err := e.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "task.headers" || fe.Value != name || !strings.Contains(fe.Reason, "reserved") {
			t.Errorf("header %q with tick_headers: %v", name, err)
		}
		e.TickHeaders = false
		if err := e.Validate(); err != nil {
			t.Errorf("header %q without tick_headers: %v", name, err)
		}
	}
	e := validEntry("th")
	e.TickHeaders = true
	e.Task.Headers = map[string]string{"cronstream": "x", "my-cronstream-entry": "y", "cron": "z"}
	if err := e.Validate(); err != nil {
		t.Errorf("headers outside the prefix: %v", err)
	}
}

// TestTickHeadersGatedAndEncoded: the option gates the entry and is a JSON
// field of its own; an entry without it encodes as before.
func TestTickHeadersGatedAndEncoded(t *testing.T) {
	t.Parallel()
	e := validEntry("th")
	if e.Gated() {
		t.Fatal("a plain entry is gated")
	}
	e.TickHeaders = true
	if !e.Gated() || GatedType(TypeEntryUpdated, e) != TypeEntryUpdated+GatedSuffix {
		t.Error("an entry with tick_headers is not gated")
	}
	b, err := json.Marshal(e.Normalize())
	if err != nil || !strings.Contains(string(b), `"tick_headers":true`) {
		t.Errorf("encoding %s, %v", b, err)
	}
	var back Entry
	if err := json.Unmarshal(b, &back); err != nil || !back.TickHeaders {
		t.Errorf("decoding: %+v, %v", back, err)
	}
	if b, _ := json.Marshal(validEntry("th").Normalize()); strings.Contains(string(b), "tick_headers") {
		t.Errorf("an entry without the option writes it: %s", b)
	}
}

// TestTaskHeaders: the headers a task gets for each kind of fire.
func TestTaskHeaders(t *testing.T) {
	t.Parallel()
	own := map[string]string{"team": "ops"}
	e := Entry{ID: "payroll", Task: Task{Type: "t", Headers: own}}
	if h := TaskHeaders(e, "2026-03-31T09:00:00Z", "", false); !maps.Equal(h, own) {
		t.Errorf("without the option: %v", h)
	}
	e.TickHeaders = true
	for _, c := range []struct {
		trigger  string
		backfill bool
		want     map[string]string
	}{
		{"", false, map[string]string{"team": "ops", "cronstream-entry": "payroll", "cronstream-scheduled-at": "2026-03-31T09:00:00Z"}},
		{"deploy-1", false, map[string]string{"team": "ops", "cronstream-entry": "payroll", "cronstream-scheduled-at": "2026-03-31T09:00:00Z", "cronstream-trigger": "deploy-1"}},
		{"", true, map[string]string{"team": "ops", "cronstream-entry": "payroll", "cronstream-scheduled-at": "2026-03-31T09:00:00Z", "cronstream-backfill": "true"}},
	} {
		if h := TaskHeaders(e, "2026-03-31T09:00:00Z", c.trigger, c.backfill); !maps.Equal(h, c.want) {
			t.Errorf("trigger %q backfill %t: %v, want %v", c.trigger, c.backfill, h, c.want)
		}
	}
	if !maps.Equal(own, map[string]string{"team": "ops"}) {
		t.Errorf("the entry's own headers changed: %v", own)
	}
}
