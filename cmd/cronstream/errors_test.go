package main

import (
	"strings"
	"testing"
)

// TestErrors: every error path exits non-zero with a message on stderr
// that says what is wrong, and prints nothing on stdout.
func TestErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "known", "--cron", "@daily", "--type", "t")
	cases := []struct {
		name string
		args []string
		want []string // each must appear in stderr
	}{
		{"bad cron names the field", []string{"entry", "put", "x", "--cron", "61 * * * *", "--type", "t"}, []string{"cron (--cron)", "61 * * * *"}},
		{"missing type names the field", []string{"entry", "put", "x", "--cron", "@daily"}, []string{"task.type (--type)", "required"}},
		{"several problems at once", []string{"entry", "put", "x", "--cron", "@daily", "--type", "t", "--timezone", "Mars/Base", "--overlap", "never", "--catchup", "most"},
			[]string{"timezone (--timezone)", "overlap (--overlap)", "catchup.policy (--catchup)"}},
		{"bad duration names the flag", []string{"entry", "put", "x", "--cron", "@daily", "--type", "t", "--timeout", "soon"}, []string{"--timeout", "soon"}},
		{"bad header", []string{"entry", "put", "x", "--cron", "@daily", "--type", "t", "--header", "novalue"}, []string{"--header", "name=value"}},
		{"payload twice", []string{"entry", "put", "x", "--payload", "a", "--payload-file", "f"}, []string{"--payload-file"}},
		{"conflict names the current revision", []string{"entry", "put", "known", "--cron", "@hourly", "--if-revision", "7"}, []string{"conflict", "current revision is 1"}},
		{"get unknown entry", []string{"entry", "get", "nope"}, []string{`"nope"`, "not found"}},
		{"rm unknown entry", []string{"entry", "rm", "nope"}, []string{"not found"}},
		{"pause unknown entry", []string{"entry", "pause", "nope"}, []string{"not found"}},
		{"resume unknown entry", []string{"entry", "resume", "nope"}, []string{"not found"}},
		{"history unknown entry", []string{"entry", "history", "nope"}, []string{"not found"}},
		{"trigger unknown entry", []string{"entry", "trigger", "nope"}, []string{"not found"}},
		{"invalid id", []string{"entry", "get", "no way"}, []string{"id", "A-Z a-z 0-9"}},
		{"missing id", []string{"entry", "get"}, []string{"accepts 1 arg"}},
		{"bad flag", []string{"entry", "put", "x", "--bogus"}, []string{"unknown flag: --bogus"}},
		{"unknown command", []string{"entri", "ls"}, []string{"unknown command"}},
		{"bad prefix", []string{"--prefix", "a.b", "entry", "ls"}, []string{"--prefix"}},
		{"bad prefix from env", nil, nil}, // below
		{"unreachable NATS", []string{"--nats", "nats://127.0.0.1:1", "entry", "ls"}, []string{"connect to NATS at nats://127.0.0.1:1"}},
		{"unreachable Redis", []string{"entry", "trigger", "known"}, []string{"connect to Redis"}},
		{"no streams for a prefix", []string{"--prefix", "other", "entry", "ls"}, []string{"OTHER_CONFIG does not exist", "--prefix"}},
		{"bad --at", []string{"entry", "ls", "--at", "yesterday"}, []string{"--at", "RFC 3339"}},
		{"--at without sign", []string{"entry", "ls", "--at", "2h"}, []string{"-2h"}},
		{"--at in the future", []string{"entry", "ls", "--at", "+1h"}, []string{"future"}},
		{"backfill without range", []string{"entry", "backfill", "known"}, []string{"--from", "--to"}},
		{"bad request id", []string{"entry", "trigger", "known", "--request-id", "a b"}, []string{"--request-id"}},
		{"audit bad glob", []string{"audit", "--type", "[x"}, []string{"--type"}},
		{"audit follow until", []string{"audit", "--follow", "--until", "-1h"}, []string{"--follow", "--until"}},
		{"sync without file", []string{"sync"}, []string{"-f FILE"}},
		{"sync missing file", []string{"sync", "-f", "/nonexistent/s.yaml"}, []string{"no such file"}},
		{"sync empty owner", []string{"sync", "-f", "x", "--owner", ""}, []string{"--owner"}},
		{"sync watch and dry-run", []string{"sync", "-f", "x", "--watch", "1m", "--dry-run"}, []string{"--watch", "--dry-run"}},
		{"status without Redis", []string{"status"}, []string{"connect to Redis"}},
		{"run bad log level", []string{"run", "--log-level", "loud"}, []string{"--log-level"}},
		{"unknown entry subcommand", []string{"entry", "lst"}, []string{`unknown command "lst"`}},
	}
	for _, tc := range cases {
		if tc.args == nil {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(tc.args...)
			if r.code == 0 {
				t.Fatalf("exit 0, want a failure:\n%s", r)
			}
			if strings.TrimSpace(r.stderr) == "" {
				t.Fatalf("no message on stderr:\n%s", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r)
				}
			}
			if tc.name != "status without Redis" && strings.TrimSpace(r.stdout) != "" {
				t.Errorf("stdout not empty on error:\n%s", r)
			}
		})
	}
	t.Run("bad prefix from env", func(t *testing.T) {
		env := *e
		env.t = t
		env.vars = append(append([]string(nil), e.vars...), "CRONSTREAM_PREFIX=a b")
		if msg := env.fail("entry", "ls"); !strings.Contains(msg, "--prefix") {
			t.Errorf("stderr: %s", msg)
		}
	})
	// Nothing of the failed puts was published.
	if out := e.ok("entry", "ls"); strings.Contains(out, "\nx ") {
		t.Errorf("a failed put published:\n%s", out)
	}
}
