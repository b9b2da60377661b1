package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/rawjson"
	"github.com/cronstream/cronstream/internal/testenv"
)

// rawValue stands for a case's value while its raw event is encoded; the
// encoded placeholder is then replaced by the value's bytes.
const rawValue = "\x00value\x00"

// inputCase is one hostile value, given to the CLI as flags and published
// raw as a config event.
type inputCase struct {
	name  string
	id    string
	field string                          // the field both verdicts name
	flags []string                        // entry put flags giving the value
	set   func(e *events.Entry, v string) // the same value in a raw event
	value string
	// escaped: the raw event writes surrogate halves as \u escapes.
	escaped bool
}

func inputCases() []inputCase {
	var headers []string
	for i := range 65 {
		headers = append(headers, "--header", fmt.Sprintf("h%d=v", i))
	}
	setHeaders := func(e *events.Entry, v string) {
		e.Task.Headers = map[string]string{"h": v}
		for i := range 64 {
			e.Task.Headers[fmt.Sprint("h", i)] = "v"
		}
	}
	setQueue := func(e *events.Entry, v string) { e.Options.Queue = v }
	return []inputCase{
		{"type not UTF-8", "type-bytes", "task.type", []string{"--type", "t\xff"}, func(e *events.Entry, v string) { e.Task.Type = v }, "t\xff", false},
		{"queue not UTF-8", "queue-bytes", "options.queue", []string{"--queue", "q\xff"}, setQueue, "q\xff", false},
		{"queue with half a surrogate pair", "queue-surrogate", "options.queue", []string{"--queue", "q\xed\xa0\x80"}, setQueue, "q\xed\xa0\x80", true},
		{"note truncated", "note-bytes", "note", []string{"--note", "n\xc3"}, func(e *events.Entry, v string) { e.Note = v }, "n\xc3", false},
		{"group not UTF-8", "group-bytes", "options.group", []string{"--group", "g\xfe"}, func(e *events.Entry, v string) { e.Options.Group = v }, "g\xfe", false},
		{"header name not UTF-8", "header-name", "task.headers", []string{"--header", "h\xff=v"}, func(e *events.Entry, v string) { e.Task.Headers = map[string]string{v: "v"} }, "h\xff", false},
		{"header value not UTF-8", "header-value", "task.headers", []string{"--header", "h=v\xff"}, func(e *events.Entry, v string) { e.Task.Headers = map[string]string{"h": v} }, "v\xff", false},
		{"label value not UTF-8", "label-value", "labels.k", []string{"--label", "k=v\xff"}, func(e *events.Entry, v string) { e.Labels = map[string]string{"k": v} }, "v\xff", false},
		{"note too long", "note-long", "note", []string{"--note", strings.Repeat("n", 1025)}, func(e *events.Entry, v string) { e.Note = v }, strings.Repeat("n", 1025), false},
		{"queue too long", "queue-long", "options.queue", []string{"--queue", strings.Repeat("q", 257)}, setQueue, strings.Repeat("q", 257), false},
		{"too many headers", "headers-many", "task.headers", headers, setHeaders, "v", false},
		{"id not an id", "bad~id", "id", nil, nil, "", false},
		{"id too long", strings.Repeat("i", 129), "id", nil, nil, "", false},
	}
}

// rawEvent is the registered event of case c as a publisher outside
// cronstream could write it.
func (c inputCase) rawEvent(t *testing.T) []byte {
	t.Helper()
	e := events.Entry{ID: c.id, Cron: "@every 1s", Task: events.Task{Type: "raw"}}
	if c.set != nil {
		c.set(&e, rawValue)
	}
	ev, err := events.NewEvent(events.GatedType(events.TypeEntryRegistered, e), "raw-publisher", c.id, e.Normalize())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if c.set == nil {
		return b
	}
	ph, _ := json.Marshal(rawValue)
	if !bytes.Contains(b, ph) {
		t.Fatalf("%s: placeholder not in %s", c.name, b)
	}
	return bytes.Replace(b, ph, []byte(rawjson.Literal(c.value, c.escaped)), 1)
}

// TestHostileInputSameVerdict: every hostile value the CLI refuses (text
// that is not UTF-8 in any field, half a surrogate pair, oversized fields,
// ids validation refuses) is refused the same way when a publisher writes
// it straight to the config subject: the running replica quarantines only
// that entry, naming the same field, and shows it in status, entry ls, its
// metrics and its log, while other entries keep firing; no task reaches
// Redis in a repaired queue such as "q\ufffd". A put of valid text repairs a
// quarantined entry.
func TestHostileInputSameVerdict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "good", "--cron", "@every 1s", "--type", "good", "--queue", "good")
	p, base := startMetricsReplica(t, e, "r1")
	ins := inspector(t, e.redis.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "good")) >= 2 }, "good never fired")

	cases := inputCases()
	js := e.nats.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range cases {
		args := append([]string{"entry", "put", c.id, "--cron", "@every 1s", "--type", "t"}, c.flags...)
		r := e.run(args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.field) {
			t.Errorf("%s: the CLI must refuse naming %s:\n%s", c.name, c.field, r)
		}
		if out := e.run("entry", "history", c.id); out.code == 0 {
			t.Errorf("%s: the refused put published something:\n%s", c.name, out)
		}
		if _, err := js.Publish(ctx, "cronstream.config."+c.id, c.rawEvent(t)); err != nil {
			t.Fatalf("%s: raw publish: %v", c.name, err)
		}
	}

	var st statusJSON
	testenv.Eventually(t, 30*time.Second, func() bool {
		e.okJSON(&st, "status", "--json")
		return st.Entries.Quarantined == len(cases)
	}, "status does not list %d quarantined entries: %+v", len(cases), lazy(func() string { return fmt.Sprint(st.Entries) }))
	reasons := map[string]string{}
	for _, b := range st.Entries.Bad {
		reasons[b.ID] = b.Reason
	}
	var ls []entryJSON
	e.okJSON(&ls, "entry", "ls", "--state", "quarantined", "--json")
	listed := map[string]bool{}
	for _, x := range ls {
		listed[x.ID] = true
	}
	for _, c := range cases {
		if !strings.Contains(reasons[c.id], c.field+` "`) {
			t.Errorf("%s: status reason %q does not name %s", c.name, reasons[c.id], c.field)
		}
		if !listed[c.id] {
			t.Errorf("%s: entry ls --state quarantined does not list %q", c.name, c.id)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return metricValue(base, "cronstream_quarantined_entries") == float64(len(cases)) &&
			metricValue(base, "cronstream_config_bad_events_total") == float64(len(cases))
	}, "metrics: %v quarantined, %v bad events, want %d", lazy(func() string { return fmt.Sprint(metricValue(base, "cronstream_quarantined_entries")) }),
		lazy(func() string { return fmt.Sprint(metricValue(base, "cronstream_config_bad_events_total")) }), len(cases))
	for _, c := range cases {
		if !strings.Contains(p.Stderr(), fmt.Sprintf(`"entry":%q`, c.id)) {
			t.Errorf("%s: the replica log has no line for %q", c.name, c.id)
		}
	}

	// The good entry keeps firing; nothing of the hostile entries reached
	// Redis, under their queue as written or as encoding/json repairs it.
	before := len(pendingTasks(t, ins, "good"))
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "good")) >= before+2 }, "good stopped firing")
	queues, err := e.redis.Client(t).SMembers(ctx, "asynq:queues").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(queues, []string{"good"}) {
		t.Errorf("asynq:queues = %q, want only the good entry's queue", queues)
	}

	// The repair: the entry written whole with valid text (the text it
	// would have fired with, U+FFFD included) fires again.
	e.ok("entry", "put", "queue-bytes", "--replace", "--cron", "@every 1s", "--type", "raw", "--queue", "q\ufffd")
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "q\ufffd")) >= 1 }, "the repaired entry does not fire")
	e.okJSON(&st, "status", "--json")
	if st.Entries.Quarantined != len(cases)-1 {
		t.Errorf("after the repair: %d quarantined, want %d", st.Entries.Quarantined, len(cases)-1)
	}
}
