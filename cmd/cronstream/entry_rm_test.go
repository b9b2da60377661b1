package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestEntryRmQuarantined: whatever `entry ls` lists can be removed, also
// junk another publisher wrote on a config subject: an id the validator
// refuses, a message that is no event at all.
func TestEntryRmQuarantined(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "good", "--cron", "@daily", "--type", "t")
	js := e.nats.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	junk := map[string]string{
		"bad@id":         `{"specversion":"1.0","id":"j1","type":"cronstream.entry.registered","data":{"id":"bad@id","cron":"@daily","task":{"type":"t"}}}`,
		"garbage":        `hello`,
		"esc\x1b[2Jhere": `{}`,
	}
	for id, data := range junk {
		if _, err := js.Publish(ctx, "cronstream.config."+id, []byte(data)); err != nil {
			t.Fatalf("publish junk on %q: %v", id, err)
		}
	}
	var all []entryJSON
	e.okJSON(&all, "entry", "ls", "--json")
	quarantined := 0
	for _, x := range all {
		if x.State == "quarantined" {
			quarantined++
		}
	}
	if len(all) != 4 || quarantined != 3 {
		t.Fatalf("ls before the removals: %+v", all)
	}
	var st statusJSON
	e.okJSON(&st, "status", "--json")
	if st.Entries.Quarantined != 3 || st.Entries.Active != 1 { // as ls lists them, ids validation refuses included
		t.Errorf("status before the removals: %+v", st.Entries)
	}

	for id := range junk {
		out := e.ok("entry", "rm", id)
		if !strings.Contains(out, "removed at revision") || strings.Contains(out, "\x1b") {
			t.Errorf("rm %q: %q", id, out)
		}
	}
	e.okJSON(&all, "entry", "ls", "--json")
	if len(all) != 1 || all[0].ID != "good" {
		t.Errorf("ls after the removals: %+v", all)
	}
	e.okJSON(&st, "status", "--json")
	if st.Entries.Quarantined != 0 || st.Entries.Active != 1 {
		t.Errorf("status after the removals: %+v", st.Entries)
	}
	if msg := e.fail("entry", "rm", "garbage"); !strings.Contains(msg, "not found") {
		t.Errorf("second rm: %s", msg)
	}
	// What no config subject can carry is still refused.
	for _, id := range []string{"a.b", ">", "a b"} {
		if msg := e.fail("entry", "rm", id); !strings.Contains(msg, "subject token") {
			t.Errorf("rm %q: %s", id, msg)
		}
	}
}
