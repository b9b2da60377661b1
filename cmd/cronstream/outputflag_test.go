package main

import (
	"strings"
	"testing"
)

// TestOutputFlagEverywhere: every read command takes -o with the same
// meaning, --json is -o json, and a format a command does not have is a
// usage error naming the ones it has.
func TestOutputFlagEverywhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "out", "--cron", "@hourly", "--type", "t")
	e.ok("entry", "pause", "out", "--note", "n")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"entry", "get", "out", "-o", "yaml"}, "cron: '@hourly'"},
		{[]string{"entry", "get", "out", "-o", "json"}, `"cron": "@hourly"`},
		{[]string{"entry", "get", "out", "-o", "name"}, "entry/out\n"},
		{[]string{"entry", "get", "out", "-o", "wide"}, "revision:"},
		{[]string{"entry", "history", "out", "-o", "wide"}, "EVENT ID"},
		{[]string{"entry", "history", "out", "-o", "yaml"}, "- revision: 1"},
		{[]string{"entry", "ls", "-o", "yaml"}, "- id: out"},
		{[]string{"forecast", "-o", "yaml"}, "groups:"},
		{[]string{"forecast", "--json"}, `"groups"`},
		{[]string{"entry", "describe", "out", "-o", "yaml"}, "id: out"},
		{[]string{"audit", "-o", "yaml"}, "type: cronstream.entry.registered"},
		{[]string{"audit", "-o", "name"}, "event/"},
		{[]string{"audit", "-o", "wide"}, "CRONSTREAM_CONFIG seq 1"},
		{[]string{"audit", "--json"}, `"stream":"CRONSTREAM_CONFIG"`},
		{[]string{"status", "-o", "yaml"}, "prefix: cronstream"},
	}
	for _, c := range cases {
		if out := e.ok(c.args...); !strings.Contains(out, c.want) {
			t.Errorf("%v lacks %q:\n%s", c.args, c.want, out)
		}
	}
	// History's rows are events, named as audit names them: its two
	// config events, the same names audit gives them.
	names := e.ok("entry", "history", "out", "-o", "name")
	if strings.Count(names, "event/") != 2 || names != e.ok("audit", "--entry", "out", "-o", "name") {
		t.Errorf("entry history -o name:\n%s\nwant the two lines audit --entry out -o name prints", names)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"entry", "get", "out", "-o", "bogus"}, "use table, wide, json, yaml, name"},
		{[]string{"entry", "describe", "out", "-o", "name"}, "use table, wide, json, yaml"},
		{[]string{"forecast", "-o", "json", "--json", "-o", "yaml"}, "-o"},
	} {
		if r := e.run(c.args...); r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, want %d saying %q\n%s", c.args, r.code, exitUsage, c.want, r)
		}
	}
}
