package configsync

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

const goodYAML = `
entries:
  - id: daily-report              # required, 1-128 of [A-Za-z0-9_-]
    cron: "0 9 * * *"             # required
    timezone: Europe/Berlin       # default UTC
    task:
      type: report:daily          # required
      payload: '{"team":"ops"}'   # a string (its bytes) or a mapping (encoded as JSON)
      headers: {source: cron}
    options: {queue: reports, max_retry: 5, timeout: 10m, retention: 24h}
    catchup: {policy: latest, window: 1h}
    overlap: skip
    jitter: 30s
    paused: false
  - id: cleanup
    cron: "@every 15m"
    task:
      type: cleanup
      payload: {older_than: 7d, tables: [a, b]}
    paused: true
    note: "waiting for #123"
  - id: plain
    cron: "*/5 * * * *"
    task: {type: plain}
`

func TestParseYAML(t *testing.T) {
	cfgs, err := Parse([]byte(goodYAML), "good.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(cfgs) != 3 {
		t.Fatalf("got %d configs, want 3", len(cfgs))
	}
	d := cfgs[0]
	e := d.Entry
	if e.ID != "daily-report" || e.Cron != "0 9 * * *" || e.Timezone != "Europe/Berlin" || e.Task.Type != "report:daily" {
		t.Errorf("daily-report parsed as %+v", e)
	}
	if string(e.Task.Payload) != `{"team":"ops"}` || e.Task.Headers["source"] != "cron" {
		t.Errorf("payload %q headers %v", e.Task.Payload, e.Task.Headers)
	}
	if e.Options.Queue != "reports" || e.Options.Retries() != 5 || e.Options.Timeout.D() != 10*time.Minute || e.Options.Retention.D() != 24*time.Hour {
		t.Errorf("options %+v", e.Options)
	}
	if e.Catchup.Policy != events.CatchupLatest || e.Catchup.Window.D() != time.Hour || e.Overlap != events.OverlapSkip || e.Jitter.D() != 30*time.Second {
		t.Errorf("catchup %+v overlap %q jitter %s", e.Catchup, e.Overlap, e.Jitter)
	}
	if d.Paused == nil || *d.Paused {
		t.Errorf("paused: false must be said explicitly, got %v", d.Paused)
	}
	c := cfgs[1]
	if c.Paused == nil || !*c.Paused || c.Entry.Note != "waiting for #123" {
		t.Errorf("cleanup paused %v note %q", c.Paused, c.Entry.Note)
	}
	// A mapping payload is encoded as JSON (keys sorted by encoding/json).
	if got, want := string(c.Entry.Task.Payload), `{"older_than":"7d","tables":["a","b"]}`; got != want {
		t.Errorf("mapping payload = %s, want %s", got, want)
	}
	if cfgs[2].Paused != nil {
		t.Errorf("plain does not say paused, got %v", *cfgs[2].Paused)
	}
}

func TestParseJSON(t *testing.T) {
	src := `{"entries": [
	  {"id": "a", "cron": "@daily", "task": {"type": "t", "payload": {"x": 1}, "headers": {"h": "v"}},
	   "options": {"queue": "q", "max_retry": 0, "deadline": "1h"}, "paused": true},
	  {"id": "b", "cron": "0 * * * *", "task": {"type": "u", "payload": "raw bytes"}}
	]}`
	cfgs, err := Parse([]byte(src), "s.json")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	a := cfgs[0]
	if string(a.Entry.Task.Payload) != `{"x":1}` || a.Entry.Options.Retries() != 0 || a.Entry.Options.Deadline.D() != time.Hour || a.Paused == nil || !*a.Paused {
		t.Errorf("a parsed as %+v paused %v", a.Entry, a.Paused)
	}
	if string(cfgs[1].Entry.Task.Payload) != "raw bytes" {
		t.Errorf("b payload %q", cfgs[1].Entry.Task.Payload)
	}
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(p, []byte(goodYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfgs, err := Load(p); err != nil || len(cfgs) != 3 {
		t.Fatalf("Load = %d configs, %v", len(cfgs), err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Load of a missing file: %v, want a read error", err)
	}
}

// TestParseProblems checks that every problem is reported with its entry,
// field and line, and that nothing is returned for an invalid file.
func TestParseProblems(t *testing.T) {
	type want struct {
		entry, field string
		line         int
		msg          string
	}
	cases := []struct {
		name string
		src  string
		want []want
	}{
		{"unknown top-level field", "entries: []\nentires: []\n", []want{{"", "entires", 2, "unknown field"}}},
		{"empty file", "", []want{{"", "", 0, "entries"}}},
		{"no entries key", "foo: 1\n", []want{{"", "foo", 1, "unknown field"}}},
		{"entries null", "entries:\n", []want{{"", "", 1, "entries: []"}}},
		{"entries not a list", "entries: {a: 1}\n", []want{{"", "", 1, "must be a list"}}},
		{"two documents", "entries: []\n---\nentries: []\n", []want{{"", "", 0, "more than one"}}},
		{"not yaml", "entries: [\n", []want{{"", "", 0, "not valid YAML"}}},
		{"typo in entry", "entries:\n  - id: a\n    cron: '@daily'\n    crn: x\n    task: {type: t}\n",
			[]want{{"a", "crn", 4, "unknown field"}}},
		{"misplaced option", "entries:\n  - id: a\n    cron: '@daily'\n    queue: q\n    task: {type: t}\n",
			[]want{{"a", "queue", 4, "options"}}},
		{"unknown nested", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t, paylod: x}\n",
			[]want{{"a", "task.paylod", 4, "unknown field"}}},
		{"two payloads", "entries:\n  - id: a\n    cron: '@daily'\n    task:\n      type: t\n      payload: x\n      payload_base64: eA==\n",
			[]want{{"a", "task.payload_base64", 7, "one of payload"}}},
		{"payload_json not json", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t, payload_json: 'nope'}\n",
			[]want{{"a", "task.payload_json", 4, "not valid JSON"}}},
		{"payload_base64 not base64", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t, payload_base64: '!!'}\n",
			[]want{{"a", "task.payload_base64", 4, "base64"}}},
		{"duration without unit", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    options: {timeout: 30}\n",
			[]want{{"a", "options.timeout", 5, "no unit"}}},
		{"bad duration", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    jitter: soon\n",
			[]want{{"a", "jitter", 5, "invalid duration"}}},
		{"bad max_retry", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    options: {max_retry: many}\n",
			[]want{{"a", "options.max_retry", 5, "whole number"}}},
		{"max_fires zero", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    max_fires: 0\n",
			[]want{{"a", "max_fires", 5, "at least 1"}}},
		{"max_fires not a number", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    max_fires: lots\n",
			[]want{{"a", "max_fires", 5, "whole number"}}},
		{"bad paused", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    paused: maybe\n",
			[]want{{"a", "paused", 5, "true or false"}}},
		{"invalid cron and missing type", "entries:\n  - id: a\n    cron: '0 9 * *'\n    task: {type: ''}\n",
			[]want{{"a", "cron", 3, "expected"}, {"a", "task.type", 4, "required"}}},
		{"invalid id", "entries:\n  - id: 'a b'\n    cron: '@daily'\n    task: {type: t}\n",
			[]want{{"entries[0]", "id", 2, "A-Z"}}},
		{"missing id", "entries:\n  - cron: '@daily'\n    task: {type: t}\n",
			[]want{{"entries[0]", "id", 0, "A-Z"}}},
		{"duplicate id", "entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n  - id: a\n    cron: '@hourly'\n    task: {type: t}\n",
			[]want{{"a", "", 5, "given twice"}}},
		{"key given twice", "entries:\n  - id: a\n    cron: '@daily'\n    cron: '@hourly'\n    task: {type: t}\n",
			[]want{{"a", "cron", 4, "given twice"}}},
		{"bad timezone", "entries:\n  - id: a\n    cron: '@daily'\n    timezone: Mars/Olympus\n    task: {type: t}\n",
			[]want{{"a", "timezone", 4, "IANA"}}},
		{"bad enum", "entries:\n  - id: a\n    cron: '@daily'\n    overlap: sometimes\n    catchup: {policy: most}\n    task: {type: t}\n",
			[]want{{"a", "overlap", 4, "allow, skip, buffer-one or cancel-previous"}, {"a", "catchup.policy", 5, "none, latest or all"}}},
		{"buffer-one with a group", "entries:\n  - id: a\n    cron: '@daily'\n    overlap: buffer-one\n    options: {group: g}\n    task: {type: t}\n",
			[]want{{"a", "overlap", 4, "cannot be combined with options.group"}}},
		{"problems in several entries", "entries:\n  - id: a\n    cron: nope\n    task: {type: t}\n  - id: b\n    cron: '@daily'\n    task: {type: t, headers: [x]}\n",
			[]want{{"a", "cron", 3, ""}, {"b", "task.headers", 7, "mapping"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfgs, err := Parse([]byte(tc.src), "f.yaml")
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", cfgs)
			}
			if cfgs != nil {
				t.Errorf("Parse returned configs with an error")
			}
			var ie *InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v is not an *InvalidError", err)
			}
			if len(ie.Problems) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%v", len(ie.Problems), len(tc.want), err)
			}
			for i, w := range tc.want {
				p := ie.Problems[i]
				if p.Entry != w.entry || p.Field != w.field || (w.line != 0 && p.Line != w.line) || !strings.Contains(p.Message, w.msg) {
					t.Errorf("problem %d = %+v, want %+v", i, p, w)
				}
			}
			if !strings.Contains(err.Error(), "f.yaml") {
				t.Errorf("error does not name the file: %v", err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := []Config{{Entry: events.Entry{ID: "a", Cron: "@daily", Task: events.Task{Type: "t"}}}}
	if err := Validate(ok); err != nil {
		t.Fatalf("Validate(valid) = %v", err)
	}
	bad := append(ok, Config{Entry: events.Entry{ID: "a", Cron: "@daily", Task: events.Task{Type: "t"}}},
		Config{Entry: events.Entry{ID: "b", Cron: "@never"}})
	err := Validate(bad)
	var ie *InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("Validate(invalid) = %v", err)
	}
	fields := map[string]bool{}
	for _, p := range ie.Problems {
		fields[p.Entry+"/"+p.Field] = true
	}
	for _, f := range []string{"a/", "b/cron", "b/task.type"} {
		if !fields[f] {
			t.Errorf("missing problem %s in %v", f, err)
		}
	}
}

// TestExampleSchedules: the example the compose file syncs is valid.
func TestExampleSchedules(t *testing.T) {
	cfgs, err := Load("../examples/schedules.yaml")
	if err != nil {
		t.Fatalf("examples/schedules.yaml: %v", err)
	}
	if len(cfgs) == 0 {
		t.Fatal("no entries in examples/schedules.yaml")
	}
	limited, tick := false, false
	for _, c := range cfgs {
		limited = limited || c.Entry.MaxFires == 5
		tick = tick || c.Entry.TickHeaders
	}
	if !limited {
		t.Error("the example with max_fires: 5 did not parse to a limit")
	}
	if !tick {
		t.Error("the example with tick_headers: true did not parse to the option")
	}
}
