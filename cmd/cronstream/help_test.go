package main

import (
	"strings"
	"testing"
)

// TestHelp: every command explains itself with an example, and the shell
// completions exist.
func TestHelp(t *testing.T) {
	t.Parallel()
	e := &cliEnv{t: t, vars: baseEnv()}
	commands := [][]string{
		{}, {"run"}, {"dev"}, {"entry"}, {"entry", "put"}, {"entry", "get"}, {"entry", "ls"}, {"entry", "rm"},
		{"entry", "pause"}, {"entry", "resume"}, {"entry", "history"}, {"entry", "trigger"}, {"entry", "backfill"},
		{"sync"}, {"audit"}, {"status"}, {"healthcheck"}, {"streams"}, {"streams", "apply"}, {"completion"},
		{"entry", "describe"}, {"export"}, {"import"}, {"import", "asynq"},
	}
	for _, c := range commands {
		out := e.ok(append(c, "--help")...)
		name := strings.Join(append([]string{"cronstream"}, c...), " ")
		if !strings.Contains(out, "Usage:") || !strings.Contains(out, name) {
			t.Errorf("%s --help:\n%s", name, out)
		}
		if c := strings.Join(c, " "); c != "completion" && !strings.Contains(out, "Examples:") {
			t.Errorf("%s --help has no example:\n%s", name, out)
		}
	}
	// Every command that lists or shows takes --json.
	for _, c := range [][]string{{"entry", "get"}, {"entry", "describe"}, {"entry", "ls"}, {"entry", "history"}, {"audit"}, {"status"}, {"sync"}, {"entry", "put"}, {"entry", "trigger"}, {"entry", "backfill"}, {"streams", "apply"}} {
		if out := e.ok(append(c, "--help")...); !strings.Contains(out, "--json") {
			t.Errorf("%v has no --json", c)
		}
	}
	for shell, want := range map[string]string{"bash": "complete -o default", "zsh": "#compdef cronstream", "fish": "complete -c cronstream"} {
		if out := e.ok("completion", shell); !strings.Contains(out, want) {
			t.Errorf("completion %s lacks %q", shell, want)
		}
	}
	// Flags come from CRONSTREAM_* variables: a bad one is reported by name.
	bad := &cliEnv{t: t, vars: append(baseEnv(), "CRONSTREAM_NATS=nats://127.0.0.1:1")}
	if msg := bad.fail("entry", "ls"); !strings.Contains(msg, "nats://127.0.0.1:1") {
		t.Errorf("CRONSTREAM_NATS not used: %s", msg)
	}
	if msg := bad.fail("entry", "ls", "--nats", "nats://127.0.0.1:2"); !strings.Contains(msg, "nats://127.0.0.1:2") {
		t.Errorf("the flag does not win over the environment: %s", msg)
	}
}
