package projector

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// A projector that keeps running while its config stream is deleted and
// recreated with fewer events (so the new sequences fall below the ones it
// applied) reloads: it ends with exactly the new stream's entries, and its
// subscribers see the vanished entries removed and the new ones registered.
func TestLiveFollowAcrossStreamRecreation(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range 10 {
		publishEvent(t, js, events.TypeEntryRegistered, randomEntry(r, fmt.Sprintf("a%d", i)))
	}
	for i := range 10 {
		publishEvent(t, js, events.TypeEntryUpdated, randomEntry(r, fmt.Sprintf("a%d", i)))
	}
	logs := &logCapture{}
	p := startProjector(t, n.JetStream(t), Config{Heartbeat: 500 * time.Millisecond, Logger: slog.New(logs)})
	ctx := testCtx(t, 60*time.Second)
	if err := p.WaitFor(ctx, 20); err != nil {
		t.Fatalf("wait for seq 20: %v", err)
	}
	feed := recordFeed(t, p)
	// seen folds the feed: what the subscriber last saw per entry, and the
	// entries it saw removed.
	seen := func() (map[string]*State, map[string]bool) {
		feed.mu.Lock()
		defer feed.mu.Unlock()
		last, removed := map[string]*State{}, map[string]bool{}
		for _, c := range feed.changes {
			if !sameState(last[c.ID], c.Old) {
				t.Errorf("change for %s from %s, subscriber last saw %s", c.ID, describe(c.Old), describe(last[c.ID]))
			}
			last[c.ID] = c.New
			if c.New == nil {
				removed[c.ID] = true
			}
		}
		return last, removed
	}
	testenv.Eventually(t, 10*time.Second, func() bool { last, _ := seen(); return len(last) == 10 }, "subscriber saw the 10 entries")

	if err := js.DeleteStream(ctx, testNames.ConfigStream()); err != nil {
		t.Fatalf("delete stream: %v", err)
	}
	setupStreams(t, js, 1)
	publishEvent(t, js, events.TypeEntryRegistered, randomEntry(r, "a1"))
	publishEvent(t, js, events.TypeEntryRegistered, randomEntry(r, "b1"))
	publishEvent(t, js, events.TypeEntryRegistered, randomEntry(r, "b2"))
	publishEvent(t, js, events.TypeEntryRemoved, events.Entry{ID: "b2", Removed: true})
	publishEvent(t, js, events.TypeEntryRegistered, randomEntry(r, "b3"))

	want, lastSeq := refFromStream(t, js)
	var d string
	testenv.Eventually(t, 30*time.Second, func() bool {
		d = diffStates(t, want, stateMap(p.Entries()), p.Quarantined())
		return d == "" && p.LastSeq() == lastSeq
	}, "projection equals the new stream (last difference: %v)", lazy(func() string { return d }))
	if st := p.Stats(); st.Reloads != 1 {
		t.Fatalf("stats %+v: want 1 reload", st)
	}
	// The projector may notice the new stream before the test has
	// published all of it (even while it is empty): the reload then holds
	// a prefix of it and the rest follows as live events. So the
	// subscriber may see b2 registered and removed, or a1 removed and
	// registered again; what it must end with is the new stream.
	var removed map[string]bool
	var last map[string]*State
	testenv.Eventually(t, 10*time.Second, func() bool {
		last, removed = seen()
		for id, s := range last {
			w, ok := want.states[id]
			if (s != nil) != ok || (s != nil && s.Revision != w.rev) {
				return false
			}
		}
		for id := range want.states {
			if last[id] == nil {
				return false
			}
		}
		return true
	}, "subscriber converged to the new stream (it saw %v)", lazy(func() string { return fmt.Sprint(slices.Sorted(maps.Keys(last))) }))
	for i := range 10 {
		if id := fmt.Sprintf("a%d", i); id != "a1" && !removed[id] {
			t.Errorf("%s not removed for the subscriber", id)
		}
	}
	logs.mu.Lock()
	var warned int
	for _, rec := range logs.records {
		if rec["msg"] == "projector: config stream was recreated or restored: reloading the projection" {
			warned++
		}
	}
	logs.mu.Unlock()
	if warned != 1 {
		t.Fatalf("reload warning logged %d times, want 1", warned)
	}
	// The reloaded projection follows the new stream.
	seq := publishEvent(t, js, events.TypeEntryRemoved, events.Entry{ID: "b1", Removed: true})
	if err := p.WaitFor(ctx, seq); err != nil {
		t.Fatalf("wait for seq %d: %v", seq, err)
	}
	if _, ok := p.Get("b1"); ok {
		t.Fatalf("b1 still registered after its removal on the new stream")
	}
}

// The reader tells a stream apart from the one it read by the message at
// its last sequence and by where the stream ends, not only by its creation
// time (a restore from a snapshot may keep that).
func TestReaderNoticesAnotherStream(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	publishEvent(t, js, events.TypeEntryRegistered, randomEntry(rand.New(rand.NewPCG(1, 1)), "a"))
	seq := publishEvent(t, js, events.TypeEntryRegistered, randomEntry(rand.New(rand.NewPCG(2, 2)), "b"))
	ctx := testCtx(t, 30*time.Second)
	s, err := js.Stream(ctx, testNames.ConfigStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	newReader := func(last uint64, subject string, at time.Time) *orderedReader {
		return &orderedReader{js: n.JetStream(t), stream: testNames.ConfigStream(), created: s.CachedInfo().Created, last: last, lastSubject: subject, lastAt: at}
	}
	for _, c := range []struct {
		name string
		r    *orderedReader
		want bool
	}{
		{"same message", newReader(seq, m.Subject, m.Time), false},
		{"another message at the last sequence", newReader(seq, m.Subject, m.Time.Add(time.Nanosecond)), true},
		{"stream ends below the last sequence", newReader(seq+5, m.Subject, m.Time), true},
		{"another creation time", func() *orderedReader {
			r := newReader(seq, m.Subject, m.Time)
			r.created = r.created.Add(-time.Second)
			return r
		}(), true},
	} {
		why, err := c.r.sameStream(ctx)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if (why != "") != c.want {
			t.Errorf("%s: reason %q, want one: %v", c.name, why, c.want)
		}
	}
}
