package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/testenv"
)

// auditLine is one line of `audit --json`.
type auditLine struct {
	SpecVersion string          `json:"specversion"`
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	Subject     string          `json:"subject"`
	Stream      string          `json:"stream"`
	Seq         uint64          `json:"seq"`
	Data        json.RawMessage `json:"data"`
}

func parseAudit(t *testing.T, out string) []auditLine {
	t.Helper()
	var lines []auditLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var a auditLine
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("audit line is not JSON (%v): %s", err, l)
		}
		if a.Stream == "" || a.Seq == 0 || a.Type == "" || a.SpecVersion != "1.0" {
			t.Fatalf("audit line lacks stream, seq or the CloudEvent: %s", l)
		}
		lines = append(lines, a)
	}
	return lines
}

// label names an audit line by type and subject, for comparing orders.
func label(a auditLine) string {
	return strings.TrimPrefix(a.Type, "cronstream.") + "/" + a.Subject
}

func labels(ls []auditLine) []string {
	out := []string{}
	for _, l := range ls {
		out = append(out, label(l))
	}
	return out
}

// activity publishes one activity event straight to the activity stream,
// as the relay would.
type activity struct {
	t     *testing.T
	js    jetstream.JetStream
	names events.Names
	n     int
}

func (a *activity) publish(subject, typ, eventSubject string, data any) {
	a.t.Helper()
	a.publishMarked(subject, typ, eventSubject, data, "")
}

// publishMarked is publish with the events.HeaderRedisUnconfirmed header
// (none when unconfirmed is empty).
func (a *activity) publishMarked(subject, typ, eventSubject string, data any, unconfirmed string) {
	a.t.Helper()
	a.n++
	id := fmt.Sprintf("test-%d", a.n)
	b := eventtest.MarshalAt(a.t, id, time.Now(), typ, "cronstream/test", eventSubject, data)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := &nats.Msg{Subject: subject, Data: b, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, id)
	if unconfirmed != "" {
		m.Header.Set(events.HeaderRedisUnconfirmed, unconfirmed)
	}
	if _, err := a.js.PublishMsg(ctx, m); err != nil {
		a.t.Fatalf("publish %s: %v", subject, err)
	}
}

// publishBatch publishes recovery events of queue as one batch message,
// as the relay does with a recovery's batch record.
func (a *activity) publishBatch(queue string, typ string, data ...events.TaskRecovered) {
	a.t.Helper()
	var parts [][]byte
	for _, d := range data {
		a.n++
		parts = append(parts, eventtest.MarshalAt(a.t, fmt.Sprintf("test-%d", a.n), time.Now(), typ, "cronstream/test", queue, d))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := append(append([]byte("["), bytes.Join(parts, []byte(","))...), ']')
	if _, err := a.js.Publish(ctx, a.names.RecoverySubject(queue), msg, jetstream.WithMsgID(fmt.Sprintf("batch-%d", a.n))); err != nil {
		a.t.Fatalf("publish batch: %v", err)
	}
}

func (a *activity) fired(entry, queue string) {
	a.publish(a.names.FireSubject(entry), events.TypeEntryFired, entry, events.Fired{
		Entry: entry, ScheduledAt: time.Now().Truncate(time.Second), EnqueuedAt: time.Now(), TaskID: "cronstream:" + entry + ":" + fmt.Sprint(a.n), Queue: queue, Revision: 1, Replica: "r1"})
}

func (a *activity) skipped(entry string) {
	a.publish(a.names.FireSubject(entry), events.TypeEntrySkipped, entry, events.Skipped{Entry: entry, ScheduledAt: time.Now().Truncate(time.Second), Reason: events.SkipOverlap})
}

func (a *activity) retried(queue string) {
	at := time.Now().Add(time.Minute)
	a.publish(a.names.RecoverySubject(queue), events.TypeTaskRetried, queue, events.TaskRecovered{
		TaskID: "t1", Queue: queue, Type: "work", Retried: 1, MaxRetry: 25, RetryAt: &at, Error: "asynq: task lease expired", Replica: "r1"})
}

func TestAudit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	act := &activity{t: t, js: e.nats.JetStream(t), names: events.MustNames("cronstream")}

	// Config (via the CLI) and activity (published directly) interleaved;
	// each step is stored after the one before.
	e.ok("entry", "put", "x", "--cron", "@daily", "--type", "t", "--queue", "q1")
	act.fired("x", "q1")
	e.ok("entry", "put", "y", "--cron", "@daily", "--type", "t", "--queue", "q2")
	act.skipped("y")
	mid := time.Now().UTC()
	act.retried("q1")
	act.publish(act.names.FireSubject("x"), "com.example.custom", "x", map[string]string{"hello": "world"})
	e.ok("entry", "put", "x", "--queue", "q2") // x leaves q1
	act.fired("x", "q2")
	act.skipped("y")

	all := []string{"entry.registered/x", "entry.fired/x", "entry.registered/y", "entry.skipped/y", "task.retried/q1",
		"com.example.custom/x", "entry.updated/x", "entry.fired/x", "entry.skipped/y"}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"everything in time order", nil, all},
		{"entry", []string{"--entry", "x"}, []string{"entry.registered/x", "entry.fired/x", "com.example.custom/x", "entry.updated/x", "entry.fired/x"}},
		{"queue q1", []string{"--queue", "q1"}, []string{"entry.registered/x", "entry.fired/x", "task.retried/q1", "com.example.custom/x", "entry.updated/x"}},
		{"queue q2", []string{"--queue", "q2"}, []string{"entry.registered/y", "entry.skipped/y", "entry.updated/x", "entry.fired/x", "entry.skipped/y"}},
		{"queue q2 since the middle", []string{"--queue", "q2", "--since", mid.Format(time.RFC3339Nano)}, []string{"entry.updated/x", "entry.fired/x", "entry.skipped/y"}},
		{"entry and queue", []string{"--entry", "x", "--queue", "q2"}, []string{"entry.updated/x", "entry.fired/x"}},
		{"type short glob", []string{"--type", "entry.fired"}, []string{"entry.fired/x", "entry.fired/x"}},
		{"type full glob", []string{"--type", "cronstream.task.*"}, []string{"task.retried/q1"}},
		{"type of another vendor", []string{"--type", "com.example.*"}, []string{"com.example.custom/x"}},
		{"type glob over both streams", []string{"--type", "*.entry.*"}, []string{"entry.registered/x", "entry.fired/x", "entry.registered/y", "entry.skipped/y",
			"entry.updated/x", "entry.fired/x", "entry.skipped/y"}},
		{"since", []string{"--since", mid.Format(time.RFC3339Nano)}, all[4:]},
		{"until", []string{"--until", mid.Format(time.RFC3339Nano)}, all[:4]},
		{"since and until", []string{"--since", mid.Format(time.RFC3339Nano), "--until", "now", "--type", "entry.*"}, []string{"entry.updated/x", "entry.fired/x", "entry.skipped/y"}},
		{"relative since", []string{"--since", "-1h", "--entry", "y"}, []string{"entry.registered/y", "entry.skipped/y", "entry.skipped/y"}},
		{"nothing matches", []string{"--entry", "y", "--type", "fired"}, nil},
		{"short type name", []string{"--type", "fired"}, []string{"entry.fired/x", "entry.fired/x"}},
		{"short names, comma separated", []string{"--type", "retried,skipped"}, []string{"entry.skipped/y", "task.retried/q1", "entry.skipped/y"}},
		{"short name glob", []string{"--type", "regist*"}, []string{"entry.registered/x", "entry.registered/y"}},
		{"since a time ago without sign", []string{"--since", "1h", "--entry", "y"}, []string{"entry.registered/y", "entry.skipped/y", "entry.skipped/y"}},
		{"since days ago", []string{"--since", "7d", "--type", "fired"}, []string{"entry.fired/x", "entry.fired/x"}},
		{"until an hour ago", []string{"--until", "1h"}, nil},
		{"limit", []string{"--limit", "2"}, all[:2]},
		{"limit with a filter", []string{"--type", "skipped", "--limit", "1"}, []string{"entry.skipped/y"}},
		{"tail", []string{"--tail", "3"}, all[len(all)-3:]},
		{"tail longer than the history", []string{"--tail", "100", "--entry", "y"}, []string{"entry.registered/y", "entry.skipped/y", "entry.skipped/y"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := *e
			env.t = t
			lines := parseAudit(t, env.ok(append([]string{"audit", "--json"}, tc.args...)...))
			got := labels(lines)
			want := tc.want
			if want == nil {
				want = []string{}
			}
			if !slices.Equal(got, want) {
				t.Errorf("audit %v:\n got %v\nwant %v", tc.args, got, want)
			}
		})
	}

	// The JSON lines are the stored CloudEvents with their stream and seq.
	lines := parseAudit(t, e.ok("audit", "--json"))
	var cfgSeq, actSeq uint64
	for _, l := range lines {
		switch l.Stream {
		case "CRONSTREAM_CONFIG":
			if l.Seq <= cfgSeq {
				t.Errorf("config seq %d after %d", l.Seq, cfgSeq)
			}
			cfgSeq = l.Seq
		case "CRONSTREAM_ACTIVITY":
			if l.Seq <= actSeq {
				t.Errorf("activity seq %d after %d", l.Seq, actSeq)
			}
			actSeq = l.Seq
		default:
			t.Errorf("stream %q", l.Stream)
		}
	}
	if cfgSeq != 3 || actSeq != 6 {
		t.Errorf("last seqs config %d activity %d, want 3 and 6", cfgSeq, actSeq)
	}
	var fired events.Fired
	if err := json.Unmarshal(lines[1].Data, &fired); err != nil || fired.Queue != "q1" || fired.Entry != "x" {
		t.Errorf("fired data %s: %v", lines[1].Data, err)
	}

	// Text: one line per event, unknown types shown as they are.
	text := e.ok("audit")
	tl := strings.Split(strings.TrimSpace(text), "\n")
	if len(tl) != len(all) {
		t.Fatalf("audit text has %d lines, want %d:\n%s", len(tl), len(all), text)
	}
	for i, want := range []string{"entry.registered", "entry.fired", "entry.registered", "entry.skipped", "task.retried", "com.example.custom", "entry.updated", "entry.fired", "entry.skipped"} {
		if !strings.Contains(tl[i], want) {
			t.Errorf("line %d lacks %q: %s", i, want, tl[i])
		}
	}
	for _, want := range []string{`hello":"world`, "overlap", "queue q1", "asynq: task lease expired"} {
		if !strings.Contains(text, want) {
			t.Errorf("audit text lacks %q:\n%s", want, text)
		}
	}
}

// TestAuditTypesAndUsage: --help lists every event type with its short
// name and documents the ndjson shape; a --type that names no type is an
// error listing them, not an empty result.
// TestAuditLostAndUnconfirmed: audit shows a lost record (text and JSON,
// --type lost) and marks a fire published before Redis's replicas
// confirmed it; entry describe shows the loss and the fires it names.
func TestAuditLostAndUnconfirmed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "gone", "--cron", "@every 1h", "--type", "x", "--queue", "q1")
	e.ok("entry", "pause", "gone")
	act := &activity{t: t, js: e.nats.JetStream(t), names: events.MustNames("cronstream")}
	tick := time.Now().UTC().Add(-time.Hour).Truncate(time.Hour)
	kept := tick.Add(-time.Hour)
	act.publishMarked(act.names.FireSubject("gone"), events.TypeEntryFired, "gone", events.Fired{Entry: "gone", ScheduledAt: tick, EnqueuedAt: tick,
		TaskID: events.TaskID("cronstream", "gone", tick), Queue: "q1", Revision: 1, Replica: "r1"}, "0/1 timeout")
	act.publish(act.names.FireSubject("gone"), events.TypeTaskLost, "gone", events.TasksLost{Entry: "gone", Queue: "q1",
		ScheduledAt: &tick, Until: tick, Count: 1, Watermark: &kept, Revision: 1, Replica: "r2"})

	out := e.ok("audit", "--entry", "gone")
	for _, want := range []string{"[published before Redis replicas confirmed it: 0/1 timeout]",
		"lost ", "Redis lost the tasks of 1 fires in queue q1: scheduled " + tick.Format(time.RFC3339)} {
		if !strings.Contains(out, want) {
			t.Errorf("audit lacks %q:\n%s", want, out)
		}
	}
	lines := e.ok("audit", "--entry", "gone", "--type", "fired,lost", "--json")
	var marks []string
	for _, l := range strings.Split(strings.TrimSpace(lines), "\n") {
		var v struct {
			Type        string `json:"type"`
			Unconfirmed string `json:"redis_unconfirmed"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		marks = append(marks, v.Type+"="+v.Unconfirmed)
	}
	if want := []string{"cronstream.entry.fired=0/1 timeout", "cronstream.task.lost="}; !slices.Equal(marks, want) {
		t.Errorf("audit --json --type fired,lost: %v, want %v", marks, want)
	}
	if lost := parseAudit(t, e.ok("audit", "--type", "lost", "--json")); len(lost) != 1 || lost[0].Type != events.TypeTaskLost {
		t.Errorf("audit --type lost: %v", labels(lost))
	}
	out = e.ok("entry", "describe", "gone")
	for _, want := range []string{"lost by Redis (see below)", "fires Redis lost", "it kept those up to " + kept.Format(time.RFC3339)} {
		if !strings.Contains(out, want) {
			t.Errorf("entry describe lacks %q:\n%s", want, out)
		}
	}
	var v describeView
	if err := json.Unmarshal([]byte(e.ok("entry", "describe", "gone", "--json")), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Lost) != 1 || len(v.Fires) != 1 || !v.Fires[0].Lost {
		t.Errorf("entry describe --json: lost %+v, fires %+v", v.Lost, v.Fires)
	}
}

func TestAuditTypesAndUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	help := e.ok("audit", "--help")
	for _, ti := range events.Types {
		if !strings.Contains(help, events.ShortType(ti.Type)) || !strings.Contains(help, ti.Type) {
			t.Errorf("audit --help does not list %s", ti.Type)
		}
	}
	for _, want := range []string{`"stream"`, `"seq"`, "ndjson", "--tail", "--limit", "7d"} {
		if !strings.Contains(help, want) {
			t.Errorf("audit --help lacks %q", want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--type", "fird"}, "matches no event type"},
		{[]string{"--type", "entry.fird"}, "cronstream.entry.fired"},
		{[]string{"--limit", "1", "--tail", "1"}, "--limit and --tail"},
		{[]string{"--tail", "-1"}, "positive"},
		{[]string{"--since", "yesterday"}, "--since"},
	} {
		r := e.run(append([]string{"audit"}, tc.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("want exit %d and %q:\n%s", exitUsage, tc.want, r)
		}
	}
}

func TestParseAgo(t *testing.T) {
	now := time.Date(2025, 3, 12, 9, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"1h": now.Add(-time.Hour), "-1h": now.Add(-time.Hour), "24h": now.Add(-24 * time.Hour),
		"7d": now.Add(-7 * 24 * time.Hour), "-7d": now.Add(-7 * 24 * time.Hour), "1d12h": now.Add(-36 * time.Hour),
		"+30m": now.Add(30 * time.Minute), "now": now, "2025-03-01": time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC),
	} {
		if got, err := parseAgo("since", in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseAgo(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "d", "xd", "1x", "-", "soon"} {
		if _, err := parseAgo("since", bad, now); err == nil {
			t.Errorf("parseAgo(%q) accepted", bad)
		}
	}
}

func TestAuditFollow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	act := &activity{t: t, js: e.nats.JetStream(t), names: events.MustNames("cronstream")}
	e.ok("entry", "put", "f", "--cron", "@daily", "--type", "t")

	p := start(t, e.vars, "audit", "--follow", "--json", "--entry", "f")
	// The history first…
	if l := p.line("cronstream.entry.registered", 30*time.Second); !strings.Contains(l, `"seq":1`) {
		t.Errorf("history line %s", l)
	}
	// …then what is stored while it runs, from both streams.
	act.fired("f", "default")
	p.line("cronstream.entry.fired", 30*time.Second)
	e.ok("entry", "pause", "f")
	p.line("cronstream.entry.paused", 30*time.Second)
	act.fired("other", "default") // filtered out
	act.skipped("f")
	if l := p.line("cronstream.entry.", 30*time.Second); !strings.Contains(l, "skipped") {
		t.Errorf("got %s, want the skipped event (the other entry's fire is filtered)", l)
	}
	if code := p.stop(syscall.SIGINT, 10*time.Second); code != 0 {
		t.Errorf("audit --follow exit %d on SIGINT\n%s", code, p.Stderr())
	}
}

// TestAuditShowsEventNamesNotVersions: the changes of a gated entry (one
// with labels) are stored as ".v2" types; people read the plain names in
// the audit and the history, JSON keeps the stored type.
func TestAuditShowsEventNamesNotVersions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "gated", "--cron", "@hourly", "--type", "t", "--label", "team=ops")
	e.ok("entry", "pause", "gated", "--note", "maintenance")
	for _, args := range [][]string{{"audit"}, {"entry", "history", "gated"}} {
		out := e.ok(args...)
		if strings.Contains(out, ".v2") || !strings.Contains(out, "entry.registered") || !strings.Contains(out, "entry.paused") {
			t.Errorf("%v shows versions or lacks the names:\n%s", args, out)
		}
	}
	if out := e.ok("audit", "--json"); !strings.Contains(out, "cronstream.entry.paused.v2") {
		t.Errorf("audit --json lost the stored type:\n%s", out)
	}
}

// TestAuditFollowSaysWhenNATSGoesAway: a follow never waits in silence. NATS
// stopping is said within the check's bound, its return too, and the
// follow carries on from where it stopped; --exit-on-disconnect exits 5.
func TestAuditFollowSaysWhenNATSGoesAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "f", "--cron", "@daily", "--type", "t")
	p := start(t, e.vars, "audit", "--follow", "--entry", "f")
	p.line("entry.registered", 30*time.Second)
	quitter := start(t, e.vars, "audit", "--follow", "--exit-on-disconnect")
	quitter.line("entry.registered", 30*time.Second)

	e.nats.Shutdown()
	down := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(p.Stderr(), "NATS is not answering") && strings.Contains(p.Stderr(), "still trying")
	}, "audit --follow said nothing 10 s after NATS went away:\n%s", p.Stderr())
	if took := time.Since(down); took > 2*(connCheckEvery+connCheckTimeout) {
		t.Errorf("the outage was said after %s", took)
	}
	if code := quitter.wait(15 * time.Second); code != exitUnavailable {
		t.Errorf("--exit-on-disconnect exited %d, want %d\n%s", code, exitUnavailable, quitter.Stderr())
	}

	e.nats.Restart(t)
	testenv.Eventually(t, 20*time.Second, func() bool { return strings.Contains(p.Stderr(), "NATS is back") },
		"audit --follow did not say NATS is back:\n%s", p.Stderr())
	e.ok("entry", "pause", "f", "--note", "after the outage")
	p.line("entry.paused", 30*time.Second)
	if code := p.stop(syscall.SIGINT, 10*time.Second); code != 0 {
		t.Errorf("audit --follow exit %d on SIGINT\n%s", code, p.Stderr())
	}
	if e.run("audit", "--exit-on-disconnect").code != exitUsage {
		t.Error("--exit-on-disconnect without --follow is not a usage error")
	}
}
