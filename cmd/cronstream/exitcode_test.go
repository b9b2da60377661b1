package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestExitCodes: each documented exit status, from the real binary.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "known", "--cron", "@daily", "--type", "t")
	inSync := writeFile(t, "in-sync.yaml", "entries:\n  - {id: synced, cron: '@daily', task: {type: t}}\n")
	e.ok("sync", "-f", inSync)
	drift := writeFile(t, "drift.yaml", "entries:\n  - {id: synced, cron: '@hourly', task: {type: t}}\n")
	invalid := writeFile(t, "invalid.yaml", "entries:\n  - {id: synced, cron: nope, task: {type: t}}\n")
	// The values entry put refuses from its flags, refused from a file.
	badCron := writeFile(t, "bad-cron.yaml", "entries:\n  - {id: x, cron: '61 * * * *', task: {type: t}}\n")
	badZone := writeFile(t, "bad-zone.yaml", "entries:\n  - {id: x, cron: '@daily', timezone: Mars/Olympus, task: {type: t}}\n")
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string // in stderr; "" means stderr must be empty
	}{
		{"success", []string{"entry", "get", "known"}, 0, ""},
		{"error", []string{"sync", "-f", "/nonexistent/s.yaml"}, 1, "no such file"},
		{"invalid entry", []string{"entry", "put", "x", "--cron", "61 * * * *", "--type", "t"}, 64, "cron"},
		{"invalid timezone", []string{"entry", "put", "x", "--cron", "@daily", "--type", "t", "--timezone", "Mars/Olympus"}, 64, "timezone"},
		{"backfill range backwards", []string{"entry", "backfill", "known", "--from", "-1h", "--to", "-2h"}, 64, "--to"},
		{"audit of an entry that never was", []string{"audit", "--entry", "never-was"}, 3, "never-was"},
		{"dry run in sync", []string{"sync", "-f", inSync, "--dry-run", "--detailed-exitcode"}, 0, ""},
		{"dry run with drift", []string{"sync", "-f", drift, "--dry-run", "--detailed-exitcode"}, 2, ""},
		{"dry run with drift, json", []string{"sync", "-f", drift, "--dry-run", "--detailed-exitcode", "--json"}, 2, ""},
		{"dry run without --detailed-exitcode", []string{"sync", "-f", drift, "--dry-run"}, 0, ""},
		{"dry run of an invalid file", []string{"sync", "-f", invalid, "--dry-run", "--detailed-exitcode"}, 64, "cron"},
		{"invalid cron in a file", []string{"sync", "-f", badCron}, 64, "cron"},
		{"invalid timezone in a file", []string{"sync", "-f", badZone}, 64, "timezone"},
		{"detailed-exitcode without dry run", []string{"sync", "-f", drift, "--detailed-exitcode"}, 64, "--dry-run"},
		{"entry not found", []string{"entry", "get", "nope"}, 3, "not found"},
		{"rm not found", []string{"entry", "rm", "nope"}, 3, "not found"},
		{"revision conflict", []string{"entry", "put", "known", "--cron", "@hourly", "--if-revision", "7"}, 4, "conflict"},
		{"NATS unavailable", []string{"--nats", "nats://127.0.0.1:1", "entry", "ls"}, 5, "connect to NATS"},
		{"Redis unavailable", []string{"entry", "trigger", "known"}, 5, "connect to Redis"},
		{"unknown flag", []string{"entry", "ls", "--bogus"}, 64, "unknown flag"},
		{"bad flag value", []string{"audit", "--limit", "many"}, 64, "--limit"},
		{"unknown command", []string{"entri", "ls"}, 64, "unknown command"},
		{"unknown subcommand", []string{"entry", "lst"}, 64, "unknown command"},
		{"missing argument", []string{"entry", "get"}, 64, "accepts 1 arg"},
		{"invalid id argument", []string{"entry", "get", "no way"}, 64, "A-Z a-z 0-9"},
		{"sync without -f", []string{"sync"}, 64, "-f FILE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", r.code, tc.code, r)
			}
			if tc.stderr == "" && r.stderr != "" || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("stderr should hold %q:\n%s", tc.stderr, r)
			}
		})
	}
	t.Run("bad value in the environment", func(t *testing.T) {
		env := *e
		env.t = t
		env.vars = append(append([]string(nil), e.vars...), "CRONSTREAM_JSON=perhaps")
		if r := env.run("entry", "ls"); r.code != 64 {
			t.Errorf("exit %d, want 64:\n%s", r.code, r)
		}
	})
	if out := e.ok("--help"); !strings.Contains(out, "64  usage") || !strings.Contains(out, "5   NATS or Redis unavailable") {
		t.Errorf("--help does not document the exit statuses:\n%s", out)
	}
}

// TestVersion: --version says what the binary was built from, and a
// replica's /metrics says the same in cronstream_build_info.
func TestVersion(t *testing.T) {
	t.Parallel()
	e := &cliEnv{t: t, vars: baseEnv()}
	out := e.ok("--version")
	m := regexp.MustCompile(`^cronstream (\S+) \(revision (\S+), (go\S+)\)\n$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("--version: %q", out)
	}

	n := testenv.StartNATS(t)
	r := testenv.StartRedis(t)
	p := start(t, append(baseEnv(), "CRONSTREAM_NATS="+n.URL(), "CRONSTREAM_REDIS="+r.URL), "run", "--http", "127.0.0.1:0", "--log-format", "json")
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "run did not log its HTTP address")
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `cronstream_build_info{goversion="` + m[3] + `",revision="` + m[2] + `",version="` + m[1] + `"} 1`
	if !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

func TestBuildInfoFromLdflags(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v1.2.3"
	if b := readBuildInfo(); b.Version != "v1.2.3" || b.GoVersion == "" || b.Revision == "" {
		t.Errorf("build info %+v, want version v1.2.3", b)
	}
	version = ""
	if b := readBuildInfo(); b.Version == "" {
		t.Errorf("without -ldflags the version is empty: %+v", b)
	}
}

// TestExitStatusTableInREADME: the README's exit-status table is --help's.
func TestExitStatusTableInREADME(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	table := strings.TrimPrefix(exitStatusHelp, "Exit status:\n")
	if !strings.Contains(string(readme), table) {
		t.Errorf("README.md does not hold the exit-status table of --help:\n%s", table)
	}
}
