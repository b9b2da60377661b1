package projector

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

var testNames = events.MustNames("pt")

// testCtx returns a context that ends with the test.
func testCtx(t testing.TB, d time.Duration) context.Context { return testenv.Context(t, d) }

// setupStreams creates the config (and activity) stream with the events
// package's own configuration.
func setupStreams(t testing.TB, js jetstream.JetStream, replicas int) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: testNames, Replicas: replicas}); err != nil {
		t.Fatalf("ensure streams: %v", err)
	}
}

// startNATS starts a single node with the streams and returns it with a
// JetStream handle for publishing.
func startNATS(t testing.TB) (*testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	setupStreams(t, js, 1)
	return n, js
}

// startProjector starts a projector on its own connection-bound js and stops
// it at cleanup.
// startProjector runs a projector of testNames on js (cfg sets more;
// its JS and Names are set here, its Logger defaults to the test's).
func startProjector(t testing.TB, js jetstream.JetStream, cfg Config) *Projector {
	t.Helper()
	cfg.JS, cfg.Names = js, testNames
	cfg.Logger = cmp.Or(cfg.Logger, testLogger(t))
	p := mustNew(t, cfg)
	if err := p.Start(testCtx(t, 30*time.Second)); err != nil {
		t.Fatalf("start projector: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

func mustNew(t testing.TB, cfg Config) *Projector {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testLogger(t testing.TB) *slog.Logger { return testlog.Logger(t, slog.LevelWarn) }

var crons = []string{"* * * * *", "*/5 * * * *", "0 9 * * 1-5", "@every 30s", "@daily", "30 */2 * * *"}
var zones = []string{"", "UTC", "Europe/Berlin", "America/New_York"}
var queues = []string{"", "default", "critical", "reports"}

func randomEntry(r *rand.Rand, id string) events.Entry {
	e := events.Entry{
		ID:       id,
		Cron:     crons[r.IntN(len(crons))],
		Timezone: zones[r.IntN(len(zones))],
		Task:     events.Task{Type: "task:" + id, Payload: []byte(fmt.Sprintf(`{"n":%d}`, r.IntN(1000)))},
		Options:  events.Options{Queue: queues[r.IntN(len(queues))]},
		Owner:    []string{"", "sync"}[r.IntN(2)],
	}
	if r.IntN(3) == 0 {
		e.Task.Headers = map[string]string{"source": "cron", "n": fmt.Sprint(r.IntN(10))}
	}
	return e.Normalize()
}

// publishEvent publishes one config event for id and returns its sequence.
func publishEvent(t testing.TB, js jetstream.JetStream, typ string, e events.Entry) uint64 {
	t.Helper()
	ev, err := events.NewEvent(typ, "test", e.ID, e)
	if err != nil {
		t.Fatalf("new event: %v", err)
	}
	b, err := ev.Marshal()
	if err != nil {
		t.Fatalf("marshal event: %v", err)
	}
	return publishRaw(t, js, testNames.ConfigSubject(e.ID), b)
}

func publishRaw(t testing.TB, js jetstream.JetStream, subject string, data []byte) uint64 {
	t.Helper()
	ack, err := js.Publish(testCtx(t, 10*time.Second), subject, data)
	if err != nil {
		t.Fatalf("publish to %s: %v", subject, err)
	}
	return ack.Sequence
}

// rawEvent builds the bytes of a config event with arbitrary type and data.
func rawEvent(t testing.TB, typ, subject string, data any) []byte {
	t.Helper()
	ev, err := events.NewEvent(typ, "test", subject, data)
	if err != nil {
		t.Fatalf("new event: %v", err)
	}
	b, err := ev.Marshal()
	if err != nil {
		t.Fatalf("marshal event: %v", err)
	}
	return b
}

// refState is the reference fold's view of one entry.
type refState struct {
	entry events.Entry
	rev   uint64
}

// refFold is the test's own fold, written from docs/design.md and not from
// the package: a valid event sets the entry's state (removed deletes it), a
// bad one removes the entry and quarantines it until its next valid event.
type refFold struct {
	states      map[string]refState
	quarantined map[string]uint64
}

func newRefFold() *refFold {
	return &refFold{states: map[string]refState{}, quarantined: map[string]uint64{}}
}

// op is one published config event as the test knows it.
type op struct {
	seq   uint64
	id    string
	typ   string
	entry events.Entry // what was published (valid events)
	bad   bool
	kind  int       // which of badKinds, for bad events
	at    time.Time // stream timestamp, filled in when needed
}

func (f *refFold) apply(o op) {
	if o.bad {
		delete(f.states, o.id)
		f.quarantined[o.id] = o.seq
		return
	}
	delete(f.quarantined, o.id)
	if o.typ == events.TypeEntryRemoved {
		delete(f.states, o.id)
		return
	}
	f.states[o.id] = refState{entry: o.entry.Normalize(), rev: o.seq}
}

func foldOps(ops []op) *refFold {
	f := newRefFold()
	for _, o := range ops {
		f.apply(o)
	}
	return f
}

// refFromStream folds every message of the config stream, read back with
// plain stream gets, in the test's own way (all events in these streams are
// valid).
func refFromStream(t testing.TB, js jetstream.JetStream) (*refFold, uint64) {
	t.Helper()
	ctx := testCtx(t, 60*time.Second)
	s, err := js.Stream(ctx, testNames.ConfigStream())
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	last := s.CachedInfo().State.LastSeq
	f := newRefFold()
	for seq := uint64(1); seq <= last; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get msg %d: %v", seq, err)
		}
		ev, err := events.DecodeEvent(m.Data)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		var e events.Entry
		if err := ev.DecodeData(&e); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		f.apply(op{seq: seq, id: e.ID, typ: ev.Type, entry: e})
	}
	return f, last
}

func entryJSON(t testing.TB, e events.Entry) string {
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatalf("marshal entry: %v", err)
	}
	return string(b)
}

// diffStates describes how got differs from the reference, "" when equal.
func diffStates(t testing.TB, want *refFold, got map[string]State, gotQ []Quarantine) string {
	var diffs []string
	for id, w := range want.states {
		g, ok := got[id]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: missing (want rev %d)", id, w.rev))
		case g.Revision != w.rev:
			diffs = append(diffs, fmt.Sprintf("%s: rev %d, want %d", id, g.Revision, w.rev))
		case entryJSON(t, g.Entry) != entryJSON(t, w.entry):
			diffs = append(diffs, fmt.Sprintf("%s: entry\n got %s\nwant %s", id, entryJSON(t, g.Entry), entryJSON(t, w.entry)))
		}
	}
	for id, g := range got {
		if _, ok := want.states[id]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: unexpected (rev %d)", id, g.Revision))
		}
	}
	gq := map[string]uint64{}
	for _, q := range gotQ {
		gq[q.ID] = q.Seq
	}
	if fmt.Sprint(gq) != fmt.Sprint(want.quarantined) {
		diffs = append(diffs, fmt.Sprintf("quarantined %v, want %v", gq, want.quarantined))
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "\n")
}

func stateMap(states []State) map[string]State {
	m := make(map[string]State, len(states))
	for _, s := range states {
		m[s.Entry.ID] = s
	}
	return m
}

// feedRecorder reads a subscription until it ends and checks the feed.
type feedRecorder struct {
	sub  *Subscription
	done chan struct{}

	mu      sync.Mutex
	changes []Change
	err     error
}

func recordFeed(t testing.TB, p *Projector) *feedRecorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &feedRecorder{sub: p.Subscribe(), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			batch, err := r.sub.Next(ctx)
			r.mu.Lock()
			r.changes = append(r.changes, batch...)
			if err != nil {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, ErrStopped) && !errors.Is(err, ErrClosed) {
					r.err = err
				}
				r.mu.Unlock()
				return
			}
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		r.sub.Close()
		<-r.done
	})
	return r
}

// check waits until the feed is consistent with want: sequences strictly
// increase (stream order, no duplicate), each change starts from the state
// the previous change of its entry ended in (no gap), and the states it ends
// in are want.
func (r *feedRecorder) check(t testing.TB, want map[string]State) {
	t.Helper()
	var problem string
	testenv.Eventually(t, 10*time.Second, func() bool {
		problem = r.problem(want)
		return problem == ""
	}, "change feed consistent with the projection (last problem: %v)", lazy(func() string { return problem }))
}

// lazy formats as what f returns at formatting time, so a failure message
// can show the last value a polled condition saw.
type lazy func() string

func (l lazy) String() string { return l() }

func (r *feedRecorder) problem(want map[string]State) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return fmt.Sprintf("feed ended with %v", r.err)
	}
	seen := map[string]*State{}
	var prev uint64
	for i, c := range r.changes {
		if c.Seq <= prev {
			return fmt.Sprintf("change %d (%s) has seq %d after %d: not in stream order or duplicated", i, c.ID, c.Seq, prev)
		}
		prev = c.Seq
		if last := seen[c.ID]; !sameState(last, c.Old) {
			return fmt.Sprintf("change %d (%s, seq %d): old %s, but the feed last left it at %s", i, c.ID, c.Seq, describe(c.Old), describe(last))
		}
		if c.New != nil && c.New.Revision != c.Seq {
			return fmt.Sprintf("change %d (%s): new revision %d, seq %d", i, c.ID, c.New.Revision, c.Seq)
		}
		seen[c.ID] = c.New
	}
	for id, s := range seen {
		w, ok := want[id]
		switch {
		case s == nil && ok:
			return fmt.Sprintf("feed left %s absent, want rev %d", id, w.Revision)
		case s != nil && !ok:
			return fmt.Sprintf("feed left %s at rev %d, want absent", id, s.Revision)
		case s != nil && s.Revision != w.Revision:
			return fmt.Sprintf("feed left %s at rev %d, want %d", id, s.Revision, w.Revision)
		}
	}
	for id, w := range want {
		if _, ok := seen[id]; !ok {
			return fmt.Sprintf("feed never delivered %s (rev %d)", id, w.Revision)
		}
	}
	return ""
}

func sameState(a, b *State) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Revision != b.Revision {
		return false
	}
	ja, _ := json.Marshal(a.Entry)
	jb, _ := json.Marshal(b.Entry)
	return bytes.Equal(ja, jb)
}

func describe(s *State) string {
	if s == nil {
		return "absent"
	}
	return fmt.Sprintf("rev %d", s.Revision)
}

// logCapture is a slog handler that keeps every record.
type logCapture struct {
	mu      sync.Mutex
	records []map[string]any
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	m := map[string]any{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Any()
		return true
	})
	c.mu.Lock()
	c.records = append(c.records, m)
	c.mu.Unlock()
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

// seqsLogged counts the log records per "seq" attribute.
func (c *logCapture) seqsLogged() map[uint64]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint64]int{}
	for _, r := range c.records {
		if s, ok := r["seq"].(uint64); ok {
			out[s]++
		}
	}
	return out
}
