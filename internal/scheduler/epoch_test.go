package scheduler_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
	"github.com/cronstream/cronstream/projector"
)

// epochNode is a node that checks refusing sequences against the config
// stream (as a replica does) and logs its warnings into w.
func (e *env) epochNode(id string, w *testlog.Buffer, o nodeOpts) *node {
	o.sched = func(c *scheduler.Config) {
		if w != nil {
			c.Logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
	}
	return e.startNode(id, o)
}

// recreateConfigStream deletes the config stream and creates it again,
// empty: its sequences start at 1 again.
func (e *env) recreateConfigStream() {
	e.t.Helper()
	if err := e.js.DeleteStream(testenv.Context(e.t, 10*time.Second), testNames.ConfigStream()); err != nil {
		e.t.Fatal(err)
	}
	if err := events.EnsureStreams(testenv.Context(e.t, 30*time.Second), e.js, events.StreamConfig{Names: testNames}); err != nil {
		e.t.Fatal(err)
	}
}

func epochsOf(nodes ...*node) uint64 {
	var n uint64
	for _, nd := range nodes {
		n += nd.counts().Epochs
	}
	return n
}

func firedOf(nodes ...*node) uint64 {
	var n uint64
	for _, nd := range nodes {
		n += nd.counts().Fired
	}
	return n
}

// checkOnce asserts that no tick of ids was handled twice and none in
// between was left without a fired or skipped event.
func (e *env) checkOnce(ids []string, queues ...string) {
	e.t.Helper()
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceIn(ledgers(e.readActivity()), ids, nil)
}

// checkOnceIn is checkOnce on the ledgers led. gap, when set, returns the
// span of an entry's ticks that may be missing (never due).
func (e *env) checkOnceIn(led map[string]*ledger, ids []string, gap func(id string) (after, until int64)) {
	e.t.Helper()
	for _, id := range ids {
		l := led[id]
		if l == nil {
			e.t.Errorf("%s never fired", id)
			continue
		}
		first, last := l.firedRange()
		if gap == nil {
			checkEverySecond(e.t, id, l, first, last)
		} else {
			after, until := gap(id)
			checkEverySecond(e.t, id, l, first, after)
			checkEverySecond(e.t, id, l, until+1, last)
		}
		for tid, n := range l.taskIDs {
			if n > 1 {
				e.t.Errorf("%s: task %s fired %d times", id, tid, n)
			}
		}
	}
}

// TestStreamRecreated: the config stream is deleted and created again and
// the entries registered anew, so the revision fence in Redis holds a
// sequence the new stream does not have. Replicas start a new epoch (one
// warning, the counter) and fire again without anyone touching Redis; no
// tick fires twice.
func TestStreamRecreated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"r0", "r1", "r2"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	// Config history: the fence ends up well above what the new stream
	// will hold.
	for i := range 12 {
		e.put(every("r0", "@every 1s", func(en *events.Entry) { en.Note = fmt.Sprint("edit ", i) }))
	}
	a := e.epochNode("a", nil, nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 9 }, "a to fire")
	a.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	e.recreateConfigStream()
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	registered := time.Now()
	var w testlog.Buffer
	b := e.epochNode("b", &w, nodeOpts{})
	c := e.epochNode("c", &w, nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return firedOf(b, c) >= 9 }, "b and c to fire again (epochs %d, refused %v %v)",
		epochsOf(b, c), b.counts().Refused, c.counts().Refused)
	if n := epochsOf(b, c); n != 1 {
		t.Errorf("%d new epochs started, want 1 (one fence cleared)", n)
	}
	if n := strings.Count(w.String(), "new stream epoch"); n != 1 {
		t.Errorf("%d warnings of a new stream epoch, want 1:\n%s", n, w.String())
	}
	b.stop()
	c.stop()
	e.checkOnceRegisteredAnew(ids, "a", registered, "default")
}

// TestStreamRestoredFromOlderSnapshot: the config stream is replaced by an
// older, shorter history, and new events land after it, so the sequences
// Redis holds now name other messages: a "moved out" marker of an entry
// that moved queues after the snapshot, and a revision fence beyond the new
// stream's end. Replicas start a new epoch for each and fire every entry
// again; no tick fires twice.
func TestStreamRestoredFromOlderSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"s0", "s1", "mover"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	a := e.epochNode("a", nil, nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 6 }, "a to fire")
	// After the snapshot: mover goes to another queue (its old slot is
	// closed at this sequence), and more edits follow.
	moved := e.put(every("mover", "@every 1s", func(en *events.Entry) { en.Options.Queue = "elsewhere" }))
	for i := range 8 {
		e.put(every("s0", "@every 1s", func(en *events.Entry) { en.Note = fmt.Sprint("edit ", i) }))
	}
	before := a.counts().Fired
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= before+6 }, "a to fire after the move")
	a.stop()
	e.waitOutboxEmpty(10*time.Second, "default", "elsewhere")

	// The snapshot: the three registrations; then other writes, so that the
	// sequence of the move holds another entry's event.
	e.recreateConfigStream()
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	registered := time.Now()
	var last uint64
	for i := 0; last <= moved; i++ {
		last = e.put(every("filler", "@every 1h", func(en *events.Entry) { en.Note = fmt.Sprint("filler ", i) }))
	}
	// The fence as an earlier build wrote it, without the id of its
	// message: checked by its sequence only.
	if err := e.rc.Del(testenv.Context(t, 5*time.Second), taskstate.Own(testPrefix, "default").FenceID()).Err(); err != nil {
		t.Fatal(err)
	}
	var w testlog.Buffer
	b := e.epochNode("b", &w, nodeOpts{})
	testenv.Eventually(t, 30*time.Second, func() bool {
		byB := map[string]int{}
		for _, a := range e.readActivity() {
			if a.Type == events.TypeEntryFired && a.Fired.Replica == "b" {
				byB[a.Fired.Entry]++
			}
		}
		for _, id := range ids {
			if byB[id] < 2 {
				return false
			}
		}
		return true
	}, "every entry to fire again (epochs %d, refused %v)", epochsOf(b), b.counts().Refused)
	if n := epochsOf(b); n != 2 {
		t.Errorf("%d new epochs started, want 2 (mover's marker and the fence)", n)
	}
	if n := strings.Count(w.String(), "new stream epoch"); n != 2 {
		t.Errorf("%d warnings of a new stream epoch, want 2:\n%s", n, w.String())
	}
	b.stop()
	e.checkOnceRegisteredAnew(ids, "a", registered, "default", "elsewhere")
}

// checkOnceRegisteredAnew is checkOnce for entries registered anew by
// registered, after the replica named before had stopped: the ticks
// between its last fire of an entry and the new registration were never
// due, so none of them is missing; every tick is still handled at most
// once.
func (e *env) checkOnceRegisteredAnew(ids []string, before string, registered time.Time, queues ...string) {
	e.t.Helper()
	e.waitOutboxEmpty(10*time.Second, queues...)
	acts := e.readActivity()
	lastBefore := map[string]int64{}
	for _, a := range acts {
		if a.Type == events.TypeEntryFired && a.Fired.Replica == before {
			lastBefore[a.Fired.Entry] = max(lastBefore[a.Fired.Entry], a.Fired.ScheduledAt.Unix())
		}
	}
	e.checkOnceIn(ledgers(acts), ids, func(id string) (int64, int64) { return lastBefore[id], registered.Unix() })
}

// TestFenceOfAnotherMessage: after the config stream was recreated and has
// grown past the old fence, the fence's sequence exists but holds another
// message than the one Redis recorded with it. A replica refused by it (its
// projection lags the fence) starts a new epoch instead of waiting for a
// sequence that will never bring that message.
func TestFenceOfAnotherMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"m0", "m1"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	var fence uint64
	for i := range 6 {
		fence = e.put(every("m0", "@every 1s", func(en *events.Entry) { en.Note = fmt.Sprint("edit ", i) }))
	}
	a := e.epochNode("a", nil, nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 4 }, "a to fire")
	a.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	e.recreateConfigStream()
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	registered := time.Now()
	// Other entries, registered once each (so no replica hands them over,
	// which would raise the fence in this stream).
	for i := 0; e.put(every(fmt.Sprint("filler", i), "@every 1h")) <= fence+2; i++ {
	}
	var w testlog.Buffer
	b := e.epochNode("b", &w, nodeOpts{projection: func(p *projector.Projector) scheduler.Projection {
		return skewedProjection{Projector: p, seq: func() uint64 { return fence - 1 }}
	}})
	testenv.Eventually(t, 20*time.Second, func() bool { return b.counts().Fired >= 4 }, "b to fire")
	if n := epochsOf(b); n != 1 {
		t.Errorf("%d new epochs started, want 1", n)
	}
	if n := strings.Count(w.String(), "holds another message"); n != 1 {
		t.Errorf("%d warnings naming another message at the fence, want 1:\n%s", n, w.String())
	}
	b.stop()
	e.checkOnceRegisteredAnew(ids, "a", registered, "default")
}

// TestHealthyDeploymentKeepsItsEpoch: several replicas, entries changing
// and moving queues, one replica lagging the stream (refused by the fence on
// every attempt, so it checks the fence again and again): no fence or marker
// is ever cleared.
func TestHealthyDeploymentKeepsItsEpoch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"h0", "h1", "h2", "h3"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	old := e.put(every("bump", "@every 1h")) - 1
	var w testlog.Buffer
	a := e.epochNode("a", &w, nodeOpts{})
	b := e.epochNode("b", &w, nodeOpts{})
	// The lagging replica tries every entry (with ownership it would give
	// its shards up, fenced, and try nothing: TestFencedOwnerLetsGo).
	lag := e.epochNode("lag", &w, nodeOpts{ownsAll: true, projection: func(p *projector.Projector) scheduler.Projection {
		return skewedProjection{Projector: p, seq: func() uint64 { return old }}
	}})
	for i := range 10 {
		e.put(every("h0", "@every 1s", func(en *events.Entry) { en.Note = fmt.Sprint("edit ", i) }))
		if i == 4 {
			e.put(every("h1", "@every 1s", func(en *events.Entry) { en.Options.Queue = "other" }))
		}
		before := firedOf(a, b)
		testenv.Eventually(t, 10*time.Second, func() bool { return firedOf(a, b) > before }, "a and b to keep firing")
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return lag.counts().Refused["revision-fenced"] >= 3 }, "the lagging replica to be fenced")
	if n := epochsOf(a, b, lag); n != 0 {
		t.Errorf("%d new epochs started in a healthy deployment", n)
	}
	if n := strings.Count(w.String(), "new stream epoch"); n != 0 {
		t.Errorf("%d warnings of a new stream epoch:\n%s", n, w.String())
	}
	a.stop()
	b.stop()
	lag.stop()
	e.checkOnce(ids, "default", "other")
}

// TestStreamRecreatedUnderRunningReplica: as TestStreamRecreated, but the
// replica keeps running across the recreation. Its projector reloads from
// the new stream, the scheduler drops the entries the new stream lacks, and
// the new stream's entries fire (after a new epoch clears the fence).
func TestStreamRecreatedUnderRunningReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, id := range []string{"u0", "u1", "u2"} {
		e.put(every(id, "@every 1s"))
	}
	for i := range 12 {
		e.put(every("u0", "@every 1s", func(en *events.Entry) { en.Note = fmt.Sprint("edit ", i) }))
	}
	var w testlog.Buffer
	a := e.epochNode("a", &w, nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 9 }, "a to fire")

	e.recreateConfigStream()
	ids := []string{"u0", "v0", "v1"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		if _, ok := a.proj.Get("u1"); ok {
			return false
		}
		led := ledgers(e.readActivity())
		for _, id := range ids[1:] {
			if led[id] == nil {
				return false
			}
		}
		return true
	}, "a to drop u1, u2 and fire v0, v1 (reloads %d, epochs %d, refused %v)",
		a.proj.Stats().Reloads, a.counts().Epochs, a.counts().Refused)
	if n := a.proj.Stats().Reloads; n != 1 {
		t.Errorf("projector reloaded %d times, want 1", n)
	}
	if n := strings.Count(w.String(), "new stream epoch"); n != 1 {
		t.Errorf("%d warnings of a new stream epoch, want 1:\n%s", n, w.String())
	}
	a.stop()
	e.checkOnce(ids, "default")
}

// TestHandoverMarkerOfAnotherMessage: after the config stream was recreated,
// a "moved out" marker's sequence holds a message of the same entry (its
// registration in the new stream), but another message than the move the
// marker recorded. The subject alone cannot tell them apart; the message id
// stored with the marker does: the replica starts a new epoch and fires the
// entry in its queue again.
func TestHandoverMarkerOfAnotherMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"k0", "mover"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	a := e.epochNode("a", nil, nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 4 }, "a to fire")
	moved := e.put(every("mover", "@every 1s", func(en *events.Entry) { en.Options.Queue = "elsewhere" }))
	before := a.counts().Fired
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= before+4 }, "a to fire after the move")
	a.stop()
	e.waitOutboxEmpty(10*time.Second, "default", "elsewhere")

	// The new stream: k0, fillers registered once each, then mover's
	// registration (in its first queue) lands exactly at the sequence of
	// the old move.
	e.recreateConfigStream()
	last := e.put(every("k0", "@every 1s"))
	for i := 0; last+1 < moved; i++ {
		last = e.put(every(fmt.Sprint("filler", i), "@every 1h"))
	}
	if seq := e.put(every("mover", "@every 1s")); seq != moved {
		t.Fatalf("mover registered at sequence %d, want %d", seq, moved)
	}
	registered := time.Now()
	var w testlog.Buffer
	b := e.epochNode("b", &w, nodeOpts{})
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, a := range e.readActivity() {
			if a.Type == events.TypeEntryFired && a.Fired.Replica == "b" && a.Fired.Entry == "mover" {
				return true
			}
		}
		return false
	}, "mover to fire in its queue again")
	if n := epochsOf(b); n != 1 {
		t.Errorf("%d new epochs started, want 1 (mover's marker)", n)
	}
	if n := strings.Count(w.String(), "holds another message"); n != 1 {
		t.Errorf("%d warnings naming another message at the marker, want 1:\n%s", n, w.String())
	}
	b.stop()
	e.checkOnceRegisteredAnew(ids, "a", registered, "default", "elsewhere")
}
