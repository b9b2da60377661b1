package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entryState is an entry from `entry get --json` without what the stream
// assigns (revision, time) or derives (state, next fire).
func entryState(t *testing.T, e *cliEnv, id string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(e.ok("entry", "get", id, "--json")), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"revision", "updated", "state", "next_fire"} {
		delete(m, k)
	}
	return m
}

func TestExport(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	bin := filepath.Join(t.TempDir(), "payload.bin")
	if err := os.WriteFile(bin, []byte{0, 1, 0xff, '\n'}, 0o600); err != nil {
		t.Fatal(err)
	}
	e.ok("entry", "put", "hello", "--cron", "@every 10s", "--type", "demo:hello", "--payload", `{"to":"world"}`)
	e.ok("entry", "put", "raw", "--cron", "@daily", "--type", "raw", "--payload-file", bin, "--header", "k=wärme")
	e.ok("entry", "pause", "raw", "--note", "maintenance")
	e.ok("sync", "-f", writeFile(t, "team.yaml", "entries:\n  - {id: team-job, cron: '0 9 * * 1-5', task: {type: t, payload: 'grüße'}}\n"), "--owner", "team")
	ids := []string{"hello", "raw", "team-job"}

	file := filepath.Join(t.TempDir(), "export.yaml")
	e.ok("export", "--output-file", file)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{`payload_json: '{"to":"world"}'`, "payload_base64: AAH/Cg==", "payload: grüße", "owner: team", `owner: ""`, "paused: true", "note: maintenance"} {
		if !strings.Contains(text, want) {
			t.Errorf("export lacks %q:\n%s", want, text)
		}
	}

	// Syncing the export, even with --prune, changes nothing.
	var rep syncJSON
	e.okJSON(&rep, "sync", "-f", file, "--prune", "--json")
	if len(rep.Actions) != 0 || len(rep.Unchanged) != 3 {
		t.Errorf("syncing the export: %+v", rep)
	}
	// -o is the format, as everywhere: JSON syncs as the YAML does; names
	// list the entries; the earlier -o FILE still writes the file, with a
	// warning.
	asJSON := writeFile(t, "export.json", e.ok("export", "-o", "json"))
	e.okJSON(&rep, "sync", "-f", asJSON, "--prune", "--json")
	if len(rep.Actions) != 0 || len(rep.Unchanged) != 3 {
		t.Errorf("syncing the JSON export: %+v", rep)
	}
	if out := e.ok("export", "-o", "name"); out != "entry/hello\nentry/raw\nentry/team-job\n" {
		t.Errorf("export -o name:\n%s", out)
	}
	old := filepath.Join(t.TempDir(), "old.yaml")
	if r := e.run("export", "-o", old); r.code != 0 || !strings.Contains(r.stderr, "deprecated") {
		t.Errorf("export -o FILE:\n%s", r)
	}
	if b, err := os.ReadFile(old); err != nil || string(b) != text {
		t.Errorf("export -o FILE wrote %q, %v", b, err)
	}
	// The owner filter.
	if out := e.ok("export", "--owner", "team"); !strings.Contains(out, "team-job") || strings.Contains(out, "hello") {
		t.Errorf("export --owner team:\n%s", out)
	}

	// Into a fresh NATS: the same entries.
	fresh := newEnv(t, false)
	fresh.ok("sync", "-f", file)
	for _, id := range ids {
		want, got := entryState(t, e, id), entryState(t, fresh, id)
		wj, _ := json.Marshal(want)
		gj, _ := json.Marshal(got)
		if string(wj) != string(gj) {
			t.Errorf("%s after export and sync:\n got %s\nwant %s", id, gj, wj)
		}
	}
}

func TestSyncPayloadForms(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	msg := e.fail("sync", "-f", writeFile(t, "two.yaml", "entries:\n  - {id: a, cron: '@daily', task: {type: t, payload: x, payload_json: '{}'}}\n"))
	if !strings.Contains(msg, "one of payload, payload_json and payload_base64") || !strings.Contains(msg, "nothing was published") {
		t.Errorf("two payloads: %s", msg)
	}
	e.ok("sync", "-f", writeFile(t, "forms.yaml", `entries:
  - {id: j, cron: '@daily', task: {type: t, payload_json: '{"to":"world"}'}}
  - {id: m, cron: '@daily', task: {type: t, payload_json: {to: world}}}
  - {id: b, cron: '@daily', task: {type: t, payload_base64: eyJ0byI6IndvcmxkIn0=}}
  - {id: p, cron: '@daily', task: {type: t, payload: eyJ0byI6IndvcmxkIn0=}}
`))
	for id, want := range map[string]string{"j": `{"to":"world"}`, "m": `{"to":"world"}`, "b": `{"to":"world"}`, "p": "eyJ0byI6IndvcmxkIn0="} {
		var got entryJSON
		e.okJSON(&got, "entry", "get", id, "--json")
		if p := got.payload(t); p != want {
			t.Errorf("%s: payload %q, want %q", id, p, want)
		}
	}
}
