package main

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// completions runs the binary's hidden __complete command (what the shell
// scripts of `cronstream completion` call) and returns the offered values
// without descriptions, and the directive line.
func completions(t *testing.T, e *cliEnv, args ...string) ([]string, string) {
	t.Helper()
	out := e.ok(append([]string{"__complete"}, args...)...)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var got []string
	for _, l := range lines[:len(lines)-1] {
		if strings.HasPrefix(l, "Completion ended") {
			continue
		}
		v, _, _ := strings.Cut(l, "\t")
		got = append(got, v)
	}
	return got, lines[len(lines)-1]
}

// TestCompletion: entry ids and queues complete from the config stream on
// a real NATS, enum flags complete their values, and an unreachable NATS
// completes nothing rather than failing or hanging.
func TestCompletion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "alpha", "--cron", "@daily", "--type", "a")
	e.ok("entry", "put", "alp2", "--cron", "@daily", "--type", "a", "--queue", "billing")
	e.ok("entry", "put", "beta", "--cron", "@daily", "--type", "b", "--queue", "reports")
	e.ok("entry", "pause", "beta")

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"entry", "describe", "al"}, []string{"alp2", "alpha"}},
		{[]string{"entry", "rm", ""}, []string{"alp2", "alpha", "beta"}},
		{[]string{"entry", "resume", "b"}, []string{"beta"}},
		{[]string{"entry", "get", "alpha", ""}, nil}, // one id only
		{[]string{"audit", "--entry", "be"}, []string{"beta"}},
		{[]string{"entry", "ls", "--queue", ""}, []string{"billing", "default", "reports"}},
		{[]string{"entry", "put", "x", "--queue", "re"}, []string{"reports"}},
		{[]string{"entry", "put", "x", "--catchup", ""}, []string{"none", "latest", "all"}},
		{[]string{"entry", "put", "x", "--overlap", ""}, []string{"allow", "skip", "buffer-one", "cancel-previous"}},
		{[]string{"entry", "ls", "--state", "p"}, []string{"paused"}},
		{[]string{"entry", "ls", "-o", ""}, []string{"table", "wide", "name", "json", "yaml"}},
		{[]string{"audit", "--type", "fired,sk"}, []string{"fired,skipped"}},
	} {
		got, dir := completions(t, e, tc.args...)
		if !slices.Equal(got, tc.want) {
			t.Errorf("complete %q = %q, want %q", tc.args, got, tc.want)
		}
		if !strings.HasPrefix(dir, ":") {
			t.Errorf("complete %q: directive line %q", tc.args, dir)
		}
	}
	if got, _ := completions(t, e, "audit", "--type", ""); !slices.Contains(got, "fired") || !slices.Contains(got, "registered") {
		t.Errorf("audit --type completes %q", got)
	}

	down := &cliEnv{t: t, vars: append(baseEnv(), "CRONSTREAM_NATS=nats://127.0.0.1:1", "CRONSTREAM_REDIS=redis://127.0.0.1:1")}
	start := time.Now()
	if got, _ := completions(t, down, "entry", "describe", ""); len(got) != 0 {
		t.Errorf("NATS down: completes %q", got)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("NATS down: completion took %s", d)
	}
}

// TestEntryLsOutputs: entry ls -o json is --json, -o yaml holds the same
// fields, -o wide adds the policy columns, and a bad -o is a usage error.
func TestEntryLsOutputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "a", "--cron", "@daily", "--type", "a", "--catchup", "latest", "--overlap", "skip", "--note", "true")
	e.ok("entry", "put", "b", "--cron", "@hourly", "--type", "b", "--payload", `{"n":1}`)
	e.ok("entry", "pause", "b")

	var viaJSON, viaO []entryView
	e.okJSON(&viaJSON, "entry", "ls", "--json")
	e.okJSON(&viaO, "entry", "ls", "-o", "json")
	if len(viaJSON) != 2 || !reflect.DeepEqual(viaJSON, viaO) {
		t.Fatalf("--json %+v\n-o json %+v", viaJSON, viaO)
	}

	// YAML → JSON → entryView: the same values as -o json (the note "true"
	// stays a string, the payload's bytes survive).
	var doc any
	if err := yaml.Unmarshal([]byte(e.ok("entry", "ls", "-o", "yaml")), &doc); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var viaYAML []entryView
	if err := json.Unmarshal(b, &viaYAML); err != nil {
		t.Fatalf("yaml output as json: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(viaJSON, viaYAML) {
		t.Fatalf("-o yaml %+v\nwant %+v", viaYAML, viaJSON)
	}

	table, wide := e.ok("entry", "ls"), e.ok("entry", "ls", "-o", "wide")
	if strings.Contains(table, "CATCHUP") || strings.Contains(table, "OVERLAP") {
		t.Errorf("table has the wide columns:\n%s", table)
	}
	for _, want := range []string{"CATCHUP", "OVERLAP", "MAX RETRY", "NOTE", "latest 1h", "skip"} {
		if !strings.Contains(wide, want) {
			t.Errorf("-o wide lacks %q:\n%s", want, wide)
		}
	}
	for _, args := range [][]string{{"-o", "xml"}, {"--json", "-o", "yaml"}} {
		if r := e.run(append([]string{"entry", "ls"}, args...)...); r.code != exitUsage {
			t.Errorf("entry ls %v:\n%s", args, r)
		}
	}
}
