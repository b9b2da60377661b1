package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/console"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/testenv"
)

const hostileNote = "<script>alert(1)</script>\x1b]0;owned\x07\x1b[31mred"

// TestConsolePages registers entries (one with a hostile note, one later
// removed, a midnight burst) and checks every page against a running
// replica with real NATS and Redis.
func TestConsolePages(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evil := events.Entry{ID: "evil", Cron: "@every 1h", Task: events.Task{Type: "x:<b>bold</b>", Payload: []byte("secret-payload")}, Owner: `"><img src=x onerror=alert(2)>`}
	s.put(evil)
	if _, err := s.client.Pause(ctx, "evil", hostileNote); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		s.put(events.Entry{ID: fmt.Sprintf("nightly-%02d", i), Cron: "0 0 * * *", Task: events.Task{Type: "report"}, Options: events.Options{Queue: "reports"}})
	}
	// Labels make it gated: its changes are stored as ".v2" types.
	s.put(events.Entry{ID: "labelled", Cron: "@hourly", Task: events.Task{Type: "t"}, Labels: map[string]string{"team": "ops"}})
	if _, err := s.client.Pause(ctx, "labelled", "by hand"); err != nil {
		t.Fatal(err)
	}
	s.put(events.Entry{ID: "gone", Cron: "*/5 * * * *", Task: events.Task{Type: "old:job"}, Owner: "team-gone"})
	if _, err := s.client.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	// The moment "gone" was stored, before its removal.
	hist, err := s.client.History(ctx, "gone")
	if err != nil || len(hist) != 2 {
		t.Fatalf("history of gone: %v %d", err, len(hist))
	}
	mid := hist[0].Time.UTC()
	s.waitFor("/entries?state=paused", "evil")

	{ // hostile entry renders inert
		for _, path := range []string{"/entries/evil", "/entries", "/entries?owner=" + url.QueryEscape(evil.Owner), "/audit?entry=evil"} {
			body := s.page(path)
			for _, bad := range []string{"<script>alert", "<img src=x", "<b>bold", "\x1b", "\x07"} {
				if strings.Contains(body, bad) {
					t.Errorf("%s holds %q unescaped", path, bad)
				}
			}
		}
		body := s.page("/entries/evil")
		for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", `\x1b]0;owned\x07\x1b[31mred`, "&lt;b&gt;bold&lt;/b&gt;"} {
			if !strings.Contains(body, want) {
				t.Errorf("entry page lacks %q", want)
			}
		}
		if strings.Contains(body, "secret-payload") {
			t.Error("payload shown without --console-payloads")
		}
	}

	{ // time travel shows a removed entry as it was
		if body := s.page("/entries"); strings.Contains(body, ">gone<") {
			t.Fatal("removed entry still listed")
		}
		body := s.page("/timetravel?at=" + url.QueryEscape(mid.Format(time.RFC3339Nano)))
		for _, want := range []string{">gone</a>", "*/5 * * * *", "old:job", "team-gone", "removed since"} {
			if !strings.Contains(body, want) {
				t.Errorf("time travel to %s lacks %q:\n%s", mid, want, body)
			}
		}
		// Sub-second precision: "now" cut to the second may come before
		// the removal stored within that second.
		if body := s.page("/timetravel?at=" + url.QueryEscape(time.Now().UTC().Format(time.RFC3339Nano))); strings.Contains(body, ">gone</a>") {
			t.Error("time travel to now shows the removed entry")
		}
		if code, _, _ := s.get("/timetravel?at=yesterday-ish"); code != http.StatusBadRequest {
			t.Errorf("bad moment: %d, want 400", code)
		}
		// A bad filter or order: 400, the form again with what is wrong.
		for _, path := range []string{
			"/timetravel?at=" + url.QueryEscape(mid.Format(time.RFC3339Nano)) + "&selector=" + url.QueryEscape("team in (x"),
			"/entries?selector=" + url.QueryEscape("team in (x"),
			"/entries?sort=colour", "/entries?order=up", "/entries?state=sleeping",
		} {
			code, _, body := s.get(path)
			if code != http.StatusBadRequest || !strings.Contains(body, `class="error"`) || !strings.Contains(body, `name="selector"`) ||
				!strings.Contains(body, "want") && !strings.Contains(body, "label selector") {
				t.Errorf("%s: %d, want 400 with the form and the error:\n%.2000s", path, code, body)
			}
		}
	}

	{ // entry page shows history with diffs and next fires
		body := s.page("/entries/evil")
		for _, want := range []string{"entry.registered", "entry.paused", "console-test", "Next fires", "Configuration history", "(hidden"} {
			if !strings.Contains(body, want) {
				t.Errorf("entry page lacks %q", want)
			}
		}
		body = s.page("/entries/gone")
		if !strings.Contains(body, "entry.removed") || !strings.Contains(body, "not registered now") {
			t.Errorf("removed entry's page lacks its history")
		}
		if code, _, _ := s.get("/entries/never-was"); code != http.StatusNotFound {
			t.Errorf("unknown entry: %d, want 404", code)
		}
	}

	{ // forecast shows the midnight peak
		body := s.page("/forecast?window=24h")
		for _, want := range []string{"30 entries fire at 00:00:00 UTC (0 0 * * *)", "<svg class=\"chart\"", "reports", "Hint: 30 entries"} {
			if !strings.Contains(body, want) {
				t.Errorf("forecast lacks %q", want)
			}
		}
	}

	{ // overview and audit
		body := s.page("/")
		for _, want := range []string{"console-r1", "live replicas", "reports", "outbox backlog"} {
			if !strings.Contains(body, want) {
				t.Errorf("overview lacks %q", want)
			}
		}
		body = s.page("/audit?stream=config&type=entry.removed")
		if !strings.Contains(body, ">gone</a>") || strings.Contains(body, "nightly-00") {
			t.Errorf("audit filtered to removals:\n%s", body)
		}
		// Event names, not their versions; a filter on the name finds the
		// gated form too.
		body = s.page("/audit?stream=config&type=entry.paused")
		if !strings.Contains(body, ">labelled</a>") || !strings.Contains(body, "entry.paused") || strings.Contains(body, ".v2") {
			t.Errorf("audit filtered to pauses shows versions or misses the gated pause:\n%s", body)
		}
		if body := s.page("/entries/labelled"); strings.Contains(body, ".v2") || !strings.Contains(body, "entry.registered") {
			t.Errorf("entry page shows versions:\n%s", body)
		}
		body = s.page("/entries?queue=reports")
		if !strings.Contains(body, "entries 1–30 of 30 matching (32 in all)") || strings.Contains(body, "nightly-") && strings.Contains(body, ">evil<") {
			t.Errorf("entries filtered by queue:\n%s", body)
		}
	}

	{ // headers and methods
		for _, path := range []string{"/", "/entries", "/forecast", "/audit", "/timetravel", "/entries/evil"} {
			code, h, _ := s.get(path)
			csp := h.Get("Content-Security-Policy")
			if code != 200 || !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
				t.Errorf("%s: %d, CSP %q", path, code, csp)
			}
		}
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			for _, path := range []string{"/", "/entries/evil", "/login", "/static/live.js"} {
				if m == http.MethodPost && path == "/login" {
					continue // the sign-in form (TestConsoleSignIn)
				}
				if code, _, _ := s.do(m, path); code != http.StatusMethodNotAllowed {
					t.Errorf("%s %s: %d, want 405", m, path, code)
				}
			}
		}
		if code, _, _ := s.get("/healthz"); code != 200 {
			t.Errorf("/healthz: %d", code)
		}
		code, h, _ := s.get("/static/live.js")
		if code != 200 || !strings.Contains(h.Get("Content-Type"), "javascript") {
			t.Errorf("/static/live.js: %d %q", code, h.Get("Content-Type"))
		}
	}
}

// TestConsoleToken: with a token every page wants it, as a bearer or a
// session; health, readiness and metrics do not.
func TestConsoleToken(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{Token: "s3cret", Payloads: true})
	s.put(events.Entry{ID: "p", Cron: "@daily", Task: events.Task{Type: "t", Payload: []byte("visible-payload")}})
	if code, _, body := s.get("/"); code != http.StatusUnauthorized || !strings.Contains(body, `name="token"`) || !strings.Contains(body, `method="post"`) {
		t.Fatalf("no token: %d\n%s", code, body)
	}
	if code, _, _ := s.get("/", "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
		t.Fatalf("wrong bearer: %d", code)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _, _ := s.get(path); code == http.StatusUnauthorized {
			t.Errorf("%s needs no token: %d", path, code)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, _, body := s.get("/entries/p", "Authorization", "Bearer s3cret")
		return strings.Contains(body, "visible-payload")
	}, "payload not shown with Payloads")
}

// TestConsoleEntryTaskStates: the entry page shows each recent fire's task
// with its asynq state read from Redis; with no worker it stays pending.
func TestConsoleEntryTaskStates(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	s.put(events.Entry{ID: "tick", Cron: "@every 1s", Task: events.Task{Type: "tick"}, Options: events.Options{Queue: "ticks"}})
	body := s.waitFor("/entries/tick", `<td class="task-state">pending</td>`)
	if !strings.Contains(body, "into ticks") {
		t.Errorf("entry page lacks the fired task's queue:\n%.3000s", body)
	}
	// The entries table names the last fire, read from the fire subject.
	s.waitFor("/entries?queue=ticks", `<span class="muted">fired</span>`)
}

// TestConsoleOverviewQueueTasks: the overview shows each queue's asynq
// task counts from Redis.
func TestConsoleOverviewQueueTasks(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	s.put(events.Entry{ID: "tick", Cron: "@every 1s", Task: events.Task{Type: "tick"}, Options: events.Options{Queue: "ticks"}})
	// Entries active, paused, ended, completed; then the asynq task counts.
	pending := regexp.MustCompile(`queue=ticks">ticks</a></td><td>1</td><td>0</td><td>0</td><td>0</td><td class="q-pending">([1-9][0-9,]*)</td><td>0</td><td>0</td><td>0</td><td>0</td><td>0</td>`)
	var body string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last overview:\n%.4000s", body)
		}
	})
	testenv.Eventually(t, 10*time.Second, func() bool {
		body = s.page("/")
		return pending.MatchString(body)
	}, "overview never showed pending tasks in queue ticks")
}

// TestConsoleOverviewShards: the overview shows shard ownership as
// status reads it (one collector): the shards, those without an owner,
// each replica's leases, their age, handovers and takeovers, and the
// queues whose duties it holds.
func TestConsoleOverviewShards(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	s.put(events.Entry{ID: "tick", Cron: "@every 1s", Task: events.Task{Type: "tick"}, Options: events.Options{Queue: "ticks"}})
	s.put(events.Entry{ID: "tock", Cron: "@every 1s", Task: events.Task{Type: "tock"}, Options: events.Options{Queue: "tocks"}})
	row := regexp.MustCompile(`<tr><td>console-r1</td><td>128</td><td>128</td><td>[0-9.]+ s</td><td>0/0</td><td>0</td><td>yes</td><td class="text"><a href="/entries\?queue=ticks">ticks</a> <a href="/entries\?queue=tocks">tocks</a></td></tr>`)
	var body string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last overview:\n%.6000s", body)
		}
	})
	testenv.Eventually(t, 15*time.Second, func() bool {
		body = s.page("/")
		return strings.Contains(body, "128 shards (2 queues × 64), 0 without an owner, least recently renewed lease") &&
			strings.Contains(body, "global duty (key sweep): console-r1.") && row.MatchString(body) &&
			strings.Contains(body, `data-count="unowned"><b>0</b> shards without an owner`)
	}, "overview never showed the replica owning every shard and both queues' duties")
}

// TestConsoleAuditBatch: the audit page shows each event of a batch message
// (a recovery of several tasks publishes one) as a row of its own.
func TestConsoleAuditBatch(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var parts []string
	for _, task := range []string{"task-one", "task-two"} {
		b := eventtest.MarshalAt(t, "recover:"+task, time.Now(), events.TypeTaskRetried, "cronstream/test", "mass",
			events.TaskRecovered{TaskID: task, Queue: "mass", Type: "work", Retried: 1, MaxRetry: 25, Error: "asynq: task lease expired"})
		parts = append(parts, string(b))
	}
	if _, err := s.js.Publish(ctx, s.names.RecoverySubject("mass"), []byte("["+strings.Join(parts, ",")+"]")); err != nil {
		t.Fatal(err)
	}
	body := s.waitFor("/audit?queue=mass", "task task-two (work)")
	for _, want := range []string{"task task-one (work), retried 1/25", "task task-two (work), retried 1/25"} {
		if !strings.Contains(body, want) {
			t.Errorf("audit page lacks %q:\n%.4000s", want, body)
		}
	}
	if strings.Contains(body, "unreadable") {
		t.Errorf("audit page shows the batch as unreadable:\n%.4000s", body)
	}
}

// TestConsoleLostFires: the entry page and the audit page show a lost
// record, and the fires it names; the audit page shows a fire published
// before Redis's replicas confirmed it.
func TestConsoleLostFires(t *testing.T) {
	t.Parallel()
	s := startSite(t, console.Config{})
	s.put(events.Entry{ID: "gone", Cron: "@every 1h", Task: events.Task{Type: "gone"}, Options: events.Options{Queue: "q1"}, Paused: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tick := time.Now().UTC().Add(-time.Hour).Truncate(time.Hour)
	before := tick.Add(-time.Hour)
	publish := func(id, typ string, data any, unconfirmed string) {
		t.Helper()
		b := eventtest.MarshalAt(t, id, time.Now(), typ, "cronstream/test", "gone", data)
		m := &nats.Msg{Subject: s.names.FireSubject("gone"), Data: b, Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, id)
		if unconfirmed != "" {
			m.Header.Set(events.HeaderRedisUnconfirmed, unconfirmed)
		}
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish(events.FiredEventID("gone", tick), events.TypeEntryFired, events.Fired{Entry: "gone", ScheduledAt: tick, EnqueuedAt: tick,
		TaskID: events.TaskID(s.names.Prefix(), "gone", tick), Queue: "q1", Revision: 1, Replica: "r1"}, "0/1 timeout")
	publish(events.LostEventID("gone", tick, tick), events.TypeTaskLost, events.TasksLost{Entry: "gone", Queue: "q1",
		ScheduledAt: &tick, Until: tick, Count: 1, Watermark: &before, Revision: 1, Replica: "r2"}, "")

	body := s.waitFor("/entries/gone", "Redis lost the tasks of 1 fires in queue q1")
	for _, want := range []string{`<td class="k-lost">lost</td>`, "Redis lost it (task.lost)", "lost by Redis"} {
		if !strings.Contains(body, want) {
			t.Errorf("entry page lacks %q:\n%.5000s", want, body)
		}
	}
	body = s.waitFor("/audit?entry=gone", "Redis lost the tasks of 1 fires in queue q1")
	if !strings.Contains(body, "published before Redis replicas confirmed it: 0/1 timeout") {
		t.Errorf("audit page does not mark the unconfirmed fire:\n%.5000s", body)
	}
	if body := s.page("/audit?type=task.lost"); !strings.Contains(body, "task.lost") || strings.Contains(body, "tick "+tick.Format(time.RFC3339)+", task") {
		t.Errorf("audit page filtered on task.lost:\n%.5000s", body)
	}
}
