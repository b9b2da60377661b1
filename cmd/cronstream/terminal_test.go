package main

import (
	"strings"
	"testing"

	"github.com/cronstream/cronstream/events"
)

// Escape sequences a hostile config could carry: clear screen, set the
// window title (OSC), carriage return over the line, a bidi override.
const (
	escClear = "\x1b[2J"
	escTitle = "\x1b]0;pwned\x07"
	escBidi  = "\u202e"
)

func noControl(t *testing.T, what, out string) {
	t.Helper()
	for _, c := range []string{"\x1b", "\x07", "\r", escBidi, "\x9b"} {
		if strings.Contains(out, c) {
			t.Errorf("%s writes %q raw:\n%q", what, c, out)
		}
	}
}

// TestTerminalSafeOutput puts escape sequences in every field a text
// output shows (type, queue, note, owner, payload, header, a quarantine
// reason, an entry id in a subject) and checks that no text output of the
// real binary writes them raw, while JSON keeps them exactly.
func TestTerminalSafeOutput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "evil", "--cron", "@every 1h", "--type", "t"+escClear, "--queue", "q"+escTitle,
		"--note", "n\r"+escBidi+"evil", "--payload", "\x1b[31mred\x9b", "--header", "h"+escClear+"=v"+escTitle)
	e.ok("entry", "put", "other", "--cron", "@daily", "--type", "t")
	e.ok("entry", "pause", "other", "--note", "p"+escTitle)
	file := writeFile(t, "s.yaml", "entries:\n  - id: owned\n    cron: '@hourly'\n    task: {type: \"o\\e[2J\"}\n    note: \"\\e]0;x\\a\"\n")
	noControl(t, "sync --dry-run", e.ok("sync", "-f", file, "--owner", "own"+escBidi, "--dry-run"))
	noControl(t, "sync", e.ok("sync", "-f", file, "--owner", "own"+escBidi))

	// A hostile publisher: an event no replica can apply (its reason
	// quotes the value) and a subject whose id the validator refuses.
	nc := e.nats.Connect(t)
	names, _ := events.NewNames(events.DefaultPrefix)
	if err := nc.Publish(names.ConfigSubject("broken"), []byte(`{"specversion":"1.0","type":"`+escClear+`"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(names.ConfigSubject("id"+escClear), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{
		{"entry", "get", "evil"},
		{"entry", "ls"},
		{"entry", "history", "evil"},
		{"entry", "history", "other"},
		{"entry", "get", "other"},
		{"entry", "get", "owned"},
		{"audit"},
		{"status"},
	} {
		r := e.run(args...)
		noControl(t, "cronstream "+strings.Join(args, " "), r.stdout+r.stderr)
	}
	out := e.ok("entry", "get", "evil")
	for _, want := range []string{`t\x1b[2J`, `q\x1b]0;pwned\x07`, `n\r\u202eevil`} {
		if !strings.Contains(out, want) {
			t.Errorf("entry get lacks the escaped %s:\n%s", want, out)
		}
	}
	var v struct {
		Task struct {
			Type string `json:"type"`
		} `json:"task"`
		Note string `json:"note"`
	}
	e.okJSON(&v, "entry", "get", "evil", "--json")
	if v.Task.Type != "t"+escClear || v.Note != "n\r"+escBidi+"evil" {
		t.Errorf("JSON changed the values: %+v", v)
	}
}

func TestTerminalSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain":            "plain",
		"täglich ✓ 日本":     "täglich ✓ 日本",
		"a\x1b[2Jb":        `a\x1b[2Jb`,
		"t\r\n\t":          `t\r\n\t`,
		"\u202eevil\u2066": `\u202eevil\u2066`,
		"c1\u009b31m":      `c1\u009b31m`,
		"del\x7f":          `del\x7f`,
		"bad\xffutf8":      `bad\xffutf8`,
		`back\slash stays`: `back\slash stays`,
	} {
		if got := terminalSafe(in); got != want {
			t.Errorf("terminalSafe(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                  "nats://127.0.0.1:4222",
		"redis://:xxxxx@h:1?addr=h2:2&addr=h3:3": `'redis://:xxxxx@h:1?addr=h2:2&addr=h3:3'`,
		"it's":                                   `'it'\''s'`,
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}
