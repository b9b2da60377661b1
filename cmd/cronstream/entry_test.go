package main

import (
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"
)

// entryJSON is what `entry get --json` prints (the entry state plus where
// it stands); payload is base64 as in the stream.
type entryJSON struct {
	ID       string `json:"id"`
	Cron     string `json:"cron"`
	Timezone string `json:"timezone"`
	Task     struct {
		Type    string            `json:"type"`
		Payload string            `json:"payload"`
		Headers map[string]string `json:"headers"`
	} `json:"task"`
	Options struct {
		Queue    string `json:"queue"`
		MaxRetry int    `json:"max_retry"`
		Timeout  string `json:"timeout"`
	} `json:"options"`
	Overlap  string     `json:"overlap"`
	Paused   bool       `json:"paused"`
	Note     string     `json:"note"`
	Owner    string     `json:"owner"`
	Revision uint64     `json:"revision"`
	State    string     `json:"state"`
	Updated  *time.Time `json:"updated"`
	NextFire *time.Time `json:"next_fire"`
	Error    string     `json:"error"`
}

func (e entryJSON) payload(t *testing.T) string {
	b, err := base64.StdEncoding.DecodeString(e.Task.Payload)
	if err != nil {
		t.Fatalf("payload %q: %v", e.Task.Payload, err)
	}
	return string(b)
}

type writeJSON struct {
	ID       string   `json:"id"`
	Result   string   `json:"result"`
	Revision uint64   `json:"revision"`
	Changes  []string `json:"changes"`
}

func TestEntryRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)

	out := e.ok("entry", "put", "report", "--cron", "0 9 * * 1-5", "--timezone", "Europe/Berlin", "--type", "report:daily",
		"--payload", `{"team":"ops"}`, "--header", "source=cron", "--max-retry", "5", "--timeout", "10m")
	if !strings.Contains(out, "entry report registered at revision 1") {
		t.Errorf("put output: %s", out)
	}
	// The same put again publishes nothing.
	if out := e.ok("entry", "put", "report", "--cron", "0 9 * * 1-5", "--timezone", "Europe/Berlin"); !strings.Contains(out, "unchanged at revision 1") {
		t.Errorf("repeated put: %s", out)
	}
	// A put of one field keeps every other one.
	var w writeJSON
	e.okJSON(&w, "entry", "put", "report", "--queue", "critical", "--json")
	if w.Result != "updated" || w.Revision != 2 || len(w.Changes) != 1 || !strings.Contains(w.Changes[0], "options.queue") {
		t.Errorf("put --queue: %+v", w)
	}
	var got entryJSON
	e.okJSON(&got, "entry", "get", "report", "--json")
	if got.Cron != "0 9 * * 1-5" || got.Timezone != "Europe/Berlin" || got.Task.Type != "report:daily" || got.payload(t) != `{"team":"ops"}` ||
		got.Task.Headers["source"] != "cron" || got.Options.MaxRetry != 5 || got.Options.Timeout != "10m" || got.Options.Queue != "critical" {
		t.Errorf("get after partial put: %+v", got)
	}
	if got.Revision != 2 || got.State != "active" || got.Updated == nil || got.NextFire == nil || !got.NextFire.After(time.Now()) {
		t.Errorf("get: revision %d state %s updated %v next %v", got.Revision, got.State, got.Updated, got.NextFire)
	}
	if text := e.ok("entry", "get", "report"); !strings.Contains(text, "options.queue:") || !strings.Contains(text, "critical") || !strings.Contains(text, "next fire:") {
		t.Errorf("get text:\n%s", text)
	}

	e.ok("entry", "put", "cleanup", "--cron", "@every 15m", "--type", "cleanup", "--overlap", "skip")
	ls := e.ok("entry", "ls")
	lines := strings.Split(strings.TrimSpace(ls), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "cleanup ") || !strings.HasPrefix(lines[2], "report ") {
		t.Fatalf("ls:\n%s", ls)
	}
	// Columns are aligned: every row starts its STATE column at the header's.
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l[col:], "active") {
			t.Errorf("ls not aligned:\n%s", ls)
		}
	}
	var all []entryJSON
	e.okJSON(&all, "entry", "ls", "--json")
	if len(all) != 2 || all[0].ID != "cleanup" || all[1].ID != "report" || all[0].Overlap != "skip" {
		t.Errorf("ls --json: %+v", all)
	}

	// Pause with a note, resume.
	if out := e.ok("entry", "pause", "report", "--note", "db migration"); !strings.Contains(out, "paused at revision 4") {
		t.Errorf("pause: %s", out)
	}
	if out := e.ok("entry", "pause", "report", "--note", "db migration"); !strings.Contains(out, "already paused") {
		t.Errorf("second pause: %s", out)
	}
	e.okJSON(&got, "entry", "get", "report", "--json")
	if !got.Paused || got.Note != "db migration" || got.State != "paused" || got.NextFire != nil {
		t.Errorf("paused entry: %+v", got)
	}
	// A put of another field keeps the pause.
	e.ok("entry", "put", "report", "--max-retry", "3")
	e.okJSON(&got, "entry", "get", "report", "--json")
	if !got.Paused || got.Options.MaxRetry != 3 {
		t.Errorf("put on a paused entry: paused %v max_retry %d", got.Paused, got.Options.MaxRetry)
	}
	e.okJSON(&w, "entry", "resume", "report", "--json")
	if w.Result != "resumed" || w.Revision != 6 {
		t.Errorf("resume: %+v", w)
	}

	// History: every revision, oldest first, with what changed.
	var hist []struct {
		Revision uint64   `json:"revision"`
		Type     string   `json:"type"`
		Source   string   `json:"source"`
		Changes  []string `json:"changes"`
	}
	e.okJSON(&hist, "entry", "history", "report", "--json")
	wantTypes := []string{"registered", "updated", "paused", "updated", "resumed"}
	if len(hist) != len(wantTypes) {
		t.Fatalf("history has %d records, want %d: %+v", len(hist), len(wantTypes), hist)
	}
	for i, h := range hist {
		if h.Type != "cronstream.entry."+wantTypes[i] || !strings.HasPrefix(h.Source, "cronstream/cli") {
			t.Errorf("history[%d] = %+v, want %s from the CLI", i, h, wantTypes[i])
		}
	}
	if len(hist[3].Changes) != 1 || !strings.Contains(hist[3].Changes[0], "options.max_retry: 5 → 3") {
		t.Errorf("history of the max-retry change: %v", hist[3].Changes)
	}
	text := e.ok("entry", "history", "report")
	for _, want := range []string{"REVISION", "entry.registered", "entry.paused", `note "db migration"`, "options.queue: default → critical"} {
		if !strings.Contains(text, want) {
			t.Errorf("history text lacks %q:\n%s", want, text)
		}
	}

	// Remove: gone from get and ls, history kept.
	if out := e.ok("entry", "rm", "report"); !strings.Contains(out, "removed at revision 7") {
		t.Errorf("rm: %s", out)
	}
	if msg := e.fail("entry", "get", "report"); !strings.Contains(msg, "not found") {
		t.Errorf("get after rm: %s", msg)
	}
	e.okJSON(&all, "entry", "ls", "--json")
	if len(all) != 1 || all[0].ID != "cleanup" {
		t.Errorf("ls after rm: %+v", all)
	}
	e.okJSON(&hist, "entry", "history", "report", "--json")
	if len(hist) != 6 || hist[5].Type != "cronstream.entry.removed" {
		t.Errorf("history after rm: %+v", hist)
	}
	// Putting it again registers it anew.
	if out := e.ok("entry", "put", "report", "--cron", "@daily", "--type", "report:daily"); !strings.Contains(out, "registered at revision 8") {
		t.Errorf("put after rm: %s", out)
	}
}

func TestEntryPutReplaceAndRevision(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "x", "--cron", "@hourly", "--type", "a", "--queue", "q", "--payload", "p", "--note", "n")
	e.ok("entry", "pause", "x", "--note", "hold")
	// --replace writes the whole entry from the command line, keeping only
	// the pause state.
	e.ok("entry", "put", "x", "--replace", "--cron", "@daily", "--type", "b")
	var got entryJSON
	e.okJSON(&got, "entry", "get", "x", "--json")
	if got.Cron != "@daily" || got.Task.Type != "b" || got.Options.Queue != "default" || got.Task.Payload != "" || !got.Paused || got.Note != "hold" {
		t.Errorf("after --replace: %+v", got)
	}
	// --replace without the required fields names them.
	msg := e.fail("entry", "put", "x", "--replace", "--queue", "q")
	if !strings.Contains(msg, "cron (--cron)") || !strings.Contains(msg, "task.type (--type)") || !strings.Contains(msg, "nothing was published") {
		t.Errorf("--replace without cron and type: %s", msg)
	}

	// --if-revision: succeeds on the current revision, fails naming it
	// otherwise; 0 means create only.
	rev := got.Revision
	e.ok("entry", "put", "x", "--jitter", "10s", "--if-revision", itoa(rev))
	msg = e.fail("entry", "put", "x", "--jitter", "20s", "--if-revision", itoa(rev))
	if !strings.Contains(msg, "revision conflict") || !strings.Contains(msg, "current revision is "+itoa(rev+1)) {
		t.Errorf("stale --if-revision: %s", msg)
	}
	msg = e.fail("entry", "put", "x", "--cron", "@daily", "--if-revision", "0")
	if !strings.Contains(msg, "current revision is "+itoa(rev+1)) {
		t.Errorf("--if-revision 0 on an existing entry: %s", msg)
	}
	e.ok("entry", "put", "y", "--cron", "@daily", "--type", "t", "--if-revision", "0")
	msg = e.fail("entry", "rm", "x", "--if-revision", itoa(rev))
	if !strings.Contains(msg, "current revision is") {
		t.Errorf("rm with a stale revision: %s", msg)
	}
	e.ok("entry", "rm", "x", "--if-revision", itoa(rev+1))

	// --payload-file, from stdin too.
	r := e.runIn("from stdin", "entry", "put", "y", "--payload-file", "-")
	if r.code != 0 {
		t.Fatalf("payload from stdin: %s", r)
	}
	e.okJSON(&got, "entry", "get", "y", "--json")
	if got.payload(t) != "from stdin" {
		t.Errorf("payload %q", got.payload(t))
	}
	p := writeFile(t, "payload.bin", "from a file")
	e.ok("entry", "put", "y", "--payload-file", p)
	e.okJSON(&got, "entry", "get", "y", "--json")
	if got.payload(t) != "from a file" {
		t.Errorf("payload %q", got.payload(t))
	}
	// --header replaces all headers; --header '' clears them.
	e.ok("entry", "put", "y", "--header", "a=1", "--header", "b=2")
	e.okJSON(&got, "entry", "get", "y", "--json")
	if len(got.Task.Headers) != 2 || got.Task.Headers["b"] != "2" {
		t.Errorf("headers %v", got.Task.Headers)
	}
	e.ok("entry", "put", "y", "--header", "")
	e.okJSON(&got, "entry", "get", "y", "--json")
	if len(got.Task.Headers) != 0 {
		t.Errorf("headers after clearing: %v", got.Task.Headers)
	}
}

// TestEntryLsAt replays the config stream to a moment between changes.
func TestEntryLsAt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "a", "--cron", "@hourly", "--type", "t")
	e.ok("entry", "put", "q", "--cron", "@daily", "--type", "t")
	e.ok("entry", "pause", "q")
	// Stream timestamps come from the same clock; the moment after the
	// command returned is after the stored events.
	at := time.Now().UTC()
	e.ok("entry", "put", "a", "--cron", "@daily")
	e.ok("entry", "put", "b", "--cron", "@daily", "--type", "t")
	e.ok("entry", "rm", "q")

	var then []entryJSON
	e.okJSON(&then, "entry", "ls", "--at", at.Format(time.RFC3339Nano), "--json")
	if len(then) != 2 || then[0].ID != "a" || then[0].Cron != "@hourly" || then[0].Revision != 1 || then[1].ID != "q" || then[1].State != "paused" {
		t.Fatalf("ls --at %s: %+v", at.Format(time.RFC3339Nano), then)
	}
	var now []entryJSON
	e.okJSON(&now, "entry", "ls", "--json")
	if len(now) != 2 || now[0].Cron != "@daily" || now[1].ID != "b" {
		t.Errorf("ls now: %+v", now)
	}
	// Relative times: an hour ago there was nothing.
	if out := e.ok("entry", "ls", "--at", "-1h"); !strings.Contains(out, "no entries at") {
		t.Errorf("ls --at -1h: %s", out)
	}
	var none []entryJSON
	e.okJSON(&none, "entry", "ls", "--at", "-1h", "--json")
	if len(none) != 0 {
		t.Errorf("ls --at -1h --json: %+v", none)
	}
	text := e.ok("entry", "ls", "--at", at.Format(time.RFC3339Nano))
	if !strings.Contains(text, "@hourly") || strings.Contains(text, "b ") {
		t.Errorf("ls --at text:\n%s", text)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// TestEntryPutWarnsOfJitterOverGap: a jitter longer than the time between
// two fires is accepted (it is valid) but said, on stderr and in --json.
func TestEntryPutWarnsOfJitterOverGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	r := e.run("entry", "put", "five", "--cron", "*/5 * * * *", "--type", "t", "--jitter", "1h")
	if r.code != 0 || !strings.Contains(r.stderr, "warning: jitter 1h is longer than the 5m between two fires") {
		t.Errorf("jitter over the gap:\n%s", r)
	}
	var out struct {
		Warnings []string `json:"warnings"`
	}
	e.okJSON(&out, "entry", "put", "five", "--jitter", "2h", "--json")
	if len(out.Warnings) != 1 {
		t.Errorf("--json warnings: %q", out.Warnings)
	}
	if r := e.run("entry", "put", "five", "--jitter", "4m"); r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Errorf("jitter under the gap:\n%s", r)
	}
}
