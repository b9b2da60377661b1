package audit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/audit"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

// testCtx ends with the test, bounded so a hang fails instead of stalling.
func testCtx(t testing.TB) context.Context { return testenv.Context(t, 45*time.Second) }

// world is one embedded NATS with both streams, a config client and a
// stand-in for the relay that publishes activity events.
type world struct {
	t     *testing.T
	js    jetstream.JetStream
	names events.Names
	c     *events.Client
	n     int
}

func newWorld(t *testing.T) *world {
	t.Helper()
	js := testenv.StartNATS(t).JetStream(t)
	names := events.MustNames("au")
	if err := events.EnsureStreams(testCtx(t), js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	return &world{t: t, js: js, names: names, c: events.NewClient(js, names, events.WithSource("cronstream/test"))}
}

func (w *world) put(id, queue string) {
	w.t.Helper()
	if _, err := w.c.Put(testCtx(w.t), events.Entry{ID: id, Cron: "@daily", Task: events.Task{Type: "t"}, Options: events.Options{Queue: queue}}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) publish(subject string, data []byte) {
	w.t.Helper()
	if _, err := w.js.Publish(testCtx(w.t), subject, data); err != nil {
		w.t.Fatalf("publish %s: %v", subject, err)
	}
}

func (w *world) event(subject, typ, eventSubject string, data any) {
	w.t.Helper()
	w.n++
	b := eventtest.MarshalAt(w.t, fmt.Sprintf("test-%d", w.n), time.Now(), typ, "cronstream/test", eventSubject, data)
	w.publish(subject, b)
}

func (w *world) fired(entry, queue string) {
	w.event(w.names.FireSubject(entry), events.TypeEntryFired, entry, events.Fired{Entry: entry, ScheduledAt: time.Now(), EnqueuedAt: time.Now(), TaskID: "t", Queue: queue, Replica: "r1"})
}

func (w *world) skipped(entry string) {
	w.event(w.names.FireSubject(entry), events.TypeEntrySkipped, entry, events.Skipped{Entry: entry, ScheduledAt: time.Now(), Reason: events.SkipOverlap})
}

func (w *world) retried(queue string) {
	w.event(w.names.RecoverySubject(queue), events.TypeTaskRetried, queue, events.TaskRecovered{TaskID: "t1", Queue: queue, Type: "work", Retried: 1, MaxRetry: 25})
}

// label names a record by type (or "malformed") and NATS subject's last
// token.
func label(rec audit.Record) string {
	typ := "malformed"
	if rec.Event != nil {
		typ = strings.TrimPrefix(rec.Event.Type, "cronstream.")
	}
	return typ + "/" + rec.Subject[strings.LastIndexByte(rec.Subject, '.')+1:]
}

// readAll reads r up to its first io.EOF.
func readAll(t *testing.T, r *audit.Reader) []string {
	t.Helper()
	got := []string{}
	for {
		rec, err := r.Next(testCtx(t))
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, label(rec))
	}
}

// readRecords reads r's records up to its first io.EOF.
func readRecords(t *testing.T, r *audit.Reader) []audit.Record {
	t.Helper()
	var recs []audit.Record
	for {
		rec, err := r.Next(testCtx(t))
		if errors.Is(err, io.EOF) {
			return recs
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
}

func open(t *testing.T, js jetstream.JetStream, p audit.Params) *audit.Reader {
	t.Helper()
	r, err := audit.Open(testCtx(t), js, p)
	if err != nil {
		t.Fatalf("Open(%+v): %v", p, err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// TestReader: both streams merged in the order they were stored, each
// filter alone and combined, a message that is not an event returned with
// its error, and the progress reported up to the whole history.
func TestReader(t *testing.T) {
	w := newWorld(t)
	w.put("x", "q1")
	w.fired("x", "q1")
	w.put("y", "q2")
	w.skipped("y")
	mid := time.Now()
	w.retried("q1")
	w.publish(w.names.FireSubject("x"), []byte("not an event"))
	w.put("x", "q2") // x leaves q1
	w.fired("x", "q2")
	w.skipped("y")

	all := []string{"entry.registered/x", "entry.fired/x", "entry.registered/y", "entry.skipped/y", "task.retried/q1",
		"malformed/x", "entry.updated/x", "entry.fired/x", "entry.skipped/y"}
	for _, tc := range []struct {
		name string
		p    audit.Params
		want []string
	}{
		{"everything", audit.Params{}, all},
		{"entry", audit.Params{Entry: "x"}, []string{"entry.registered/x", "entry.fired/x", "malformed/x", "entry.updated/x", "entry.fired/x"}},
		{"queue q1", audit.Params{Queue: "q1"}, []string{"entry.registered/x", "entry.fired/x", "task.retried/q1", "malformed/x", "entry.updated/x"}},
		{"queue q2 since the middle", audit.Params{Queue: "q2", Since: mid}, []string{"entry.updated/x", "entry.fired/x", "entry.skipped/y"}},
		{"types", audit.Params{Types: []string{"fired", "cronstream.task.*"}}, []string{"entry.fired/x", "task.retried/q1", "entry.fired/x"}},
		{"since", audit.Params{Since: mid}, all[4:]},
		{"until", audit.Params{Until: mid}, all[:4]},
		{"limit", audit.Params{Limit: 2}, all[:2]},
		{"tail", audit.Params{Tail: 3}, all[len(all)-3:]},
		{"tail of a filter", audit.Params{Tail: 2, Types: []string{"entry.*"}}, []string{"entry.fired/x", "entry.skipped/y"}},
		{"nothing", audit.Params{Entry: "nobody"}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.Names = w.names
			r := open(t, w.js, tc.p)
			if got := readAll(t, r); !slices.Equal(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
			// Without Follow the end stays the end.
			if _, err := r.Next(testCtx(t)); !errors.Is(err, io.EOF) {
				t.Errorf("Next after the history: %v, want io.EOF", err)
			}
		})
	}

	t.Run("records", func(t *testing.T) {
		var last [2]uint64
		recs := readRecords(t, open(t, w.js, audit.Params{Names: w.names, Progress: func(read, total uint64) { last = [2]uint64{read, total} }}))
		if last != [2]uint64{9, 9} {
			t.Errorf("last progress %v, want 9 of 9", last)
		}
		for i, rec := range recs {
			if i > 0 && rec.Time.Before(recs[i-1].Time) {
				t.Errorf("record %d stored at %s, before the one before it", i, rec.Time)
			}
		}
		bad := recs[5]
		if bad.Config || bad.Stream != "AU_ACTIVITY" || bad.Seq != 4 || string(bad.Data) != "not an event" || bad.Event != nil || !errors.Is(bad.Err, events.ErrMalformedEvent) {
			t.Errorf("malformed record %+v", bad)
		}
		if upd := recs[6]; !upd.Config || upd.Stream != "AU_CONFIG" || upd.Seq != 3 || upd.Err != nil || upd.Event.Subject != "x" {
			t.Errorf("update record %+v", upd)
		}
	})
}

// TestReaderFollow: the history (its last records with Tail), io.EOF once,
// then what either stream stores next; Limit ends a follow.
func TestReaderFollow(t *testing.T) {
	w := newWorld(t)
	w.put("f", "")
	w.fired("f", "default")
	w.skipped("f")

	r := open(t, w.js, audit.Params{Names: w.names, Entry: "f", Tail: 2, Follow: true})
	if got, want := readAll(t, r), []string{"entry.fired/f", "entry.skipped/f"}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	w.fired("other", "default") // filtered out
	w.put("f", "critical")
	w.fired("f", "critical")
	// Live records of the two streams come as each stream delivers them.
	var live []string
	for range 2 {
		rec, err := r.Next(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, label(rec))
	}
	if slices.Sort(live); !slices.Equal(live, []string{"entry.fired/f", "entry.updated/f"}) {
		t.Fatalf("live %v, want f's update and fire", live)
	}
	// Nothing more: Next waits until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := r.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next with nothing stored: %v, want the context's error", err)
	}

	limited := open(t, w.js, audit.Params{Names: w.names, Limit: 4, Follow: true})
	if got := readAll(t, limited); len(got) != 4 {
		t.Fatalf("limit 4 read %v", got)
	}
	if _, err := limited.Next(testCtx(t)); !errors.Is(err, io.EOF) {
		t.Errorf("Next after the limit: %v, want io.EOF", err)
	}
}

// TestClose: Close ends a Next that waits, and a closed Reader leaves no
// consumer behind.
func TestClose(t *testing.T) {
	w := newWorld(t)
	w.put("a", "")
	w.fired("a", "default")
	r, err := audit.Open(testCtx(t), w.js, audit.Params{Names: w.names, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, r); len(got) != 2 {
		t.Fatalf("read %v", got)
	}
	// Close from another goroutine ends a Next that waits for live records.
	closed := make(chan error, 1)
	go func() {
		_, err := r.Next(testCtx(t))
		closed <- err
	}()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; !errors.Is(err, audit.ErrClosed) {
		t.Errorf("waiting Next on Close: %v, want ErrClosed", err)
	}
	if _, err := r.Next(testCtx(t)); !errors.Is(err, audit.ErrClosed) {
		t.Errorf("Next after Close: %v, want ErrClosed", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// Close deletes no consumer (no role may: it could not be limited to
	// its own); the server removes them after their inactive threshold.
	for _, stream := range []string{w.names.ConfigStream(), w.names.ActivityStream()} {
		s, err := w.js.Stream(testCtx(t), stream)
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() bool {
			info, err := s.Info(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			return info.State.Consumers == 0
		}, "%s still has consumers 30s after Close", stream)
	}
}

// TestOpenRefuses: params that cannot be read are refused before anything
// is read.
func TestOpenRefuses(t *testing.T) {
	now := time.Now()
	for _, p := range []audit.Params{
		{Entry: "a.b"},
		{Types: []string{"fird"}},
		{Types: []string{"[x"}},
		{Until: now, Follow: true},
		{Since: now, Until: now.Add(-time.Hour)},
		{Limit: -1},
		{Limit: 1, Tail: 1},
	} {
		if _, err := audit.Open(context.Background(), nil, p); !errors.Is(err, audit.ErrInvalidParams) {
			t.Errorf("Open(%+v): %v, want ErrInvalidParams", p, err)
		}
	}
}

func TestMatchAndCheckType(t *testing.T) {
	for _, tc := range []struct {
		pattern, typ string
		want         bool
	}{
		{"fired", events.TypeEntryFired, true},
		{"entry.fired", events.TypeEntryFired, true},
		{"cronstream.entry.*", events.TypeEntrySkipped, true},
		{"*.entry.*", events.TypeEntryPaused, true},
		{"task.*", events.TypeEntryFired, false},
		{"com.example.*", "com.example.custom", true},
	} {
		if got := audit.MatchType(tc.pattern, tc.typ); got != tc.want {
			t.Errorf("MatchType(%q, %q) = %v", tc.pattern, tc.typ, got)
		}
	}
	for pattern, want := range map[string]error{
		"fired": nil, "regist*": nil, "task.*": nil, "com.example.*": nil,
		"fird": audit.ErrUnknownType, "entry.fird": audit.ErrUnknownType, "cronstream.nothing": audit.ErrUnknownType,
		"[x": errors.New("bad pattern"),
	} {
		err := audit.CheckType(pattern)
		switch {
		case want == nil && err != nil, want != nil && err == nil:
			t.Errorf("CheckType(%q) = %v, want %v", pattern, err, want)
		case errors.Is(want, audit.ErrUnknownType) && !errors.Is(err, audit.ErrUnknownType):
			t.Errorf("CheckType(%q) = %v, want ErrUnknownType", pattern, err)
		}
	}
}

// TestReaderBatch: a batch message (a mass recovery's outcomes) is a record
// per event, in order, sharing the message's sequence; the progress counts
// messages; Tail and Limit count events; a batch that does not decode is
// one malformed record.
func TestReaderBatch(t *testing.T) {
	w := newWorld(t)
	w.put("x", "q1")
	var parts [][]byte
	for i := range 3 {
		b := eventtest.MarshalAt(t, fmt.Sprintf("recover-%d", i), time.Now(), events.TypeTaskRetried, "cronstream/test", "q1",
			events.TaskRecovered{TaskID: fmt.Sprintf("t%d", i), Queue: "q1", Type: "work", Retried: 1, MaxRetry: 25})
		parts = append(parts, b)
	}
	w.publish(w.names.RecoverySubject("q1"), append(append([]byte("["), bytes.Join(parts, []byte(","))...), ']'))
	w.publish(w.names.RecoverySubject("q1"), []byte(`[1]`))
	w.fired("x", "q1")

	var last [2]uint64
	recs := readRecords(t, open(t, w.js, audit.Params{Names: w.names, Progress: func(read, total uint64) { last = [2]uint64{read, total} }}))
	got := make([]string, len(recs))
	for i, rec := range recs {
		got[i] = label(rec)
	}
	want := []string{"entry.registered/x", "task.retried/q1", "task.retried/q1", "task.retried/q1", "malformed/q1", "entry.fired/x"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	for i, rec := range recs[1:4] {
		var d events.TaskRecovered
		if rec.Seq != 1 || rec.Event.ID != fmt.Sprintf("recover-%d", i) || rec.Event.DecodeData(&d) != nil || d.TaskID != fmt.Sprintf("t%d", i) || !bytes.Equal(rec.Data, parts[i]) {
			t.Errorf("batch event %d: %+v", i, rec)
		}
	}
	if bad := recs[4]; bad.Event != nil || !errors.Is(bad.Err, events.ErrMalformedEvent) || string(bad.Data) != "[1]" {
		t.Errorf("malformed batch %+v", bad)
	}
	if last != [2]uint64{4, 4} {
		t.Errorf("last progress %v, want 4 of 4 messages", last)
	}
	for _, tc := range []struct {
		p    audit.Params
		want []string
	}{
		{audit.Params{Tail: 2, Types: []string{"task.*"}}, []string{"task.retried/q1", "task.retried/q1"}},
		{audit.Params{Limit: 3}, want[:3]},
	} {
		tc.p.Names = w.names
		if got := readAll(t, open(t, w.js, tc.p)); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: got %v, want %v", tc.p, got, tc.want)
		}
	}
}
