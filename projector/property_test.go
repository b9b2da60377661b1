package projector

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// randomOps generates n config events over entries ids e00..e(k-1), mostly
// following an entry's life (register, update, pause, resume, remove,
// register again) and sometimes not (an update of an absent entry, a bad
// event), which the fold must handle just the same.
func randomOps(r *rand.Rand, k, n int) []op {
	type life struct {
		exists bool
		entry  events.Entry
	}
	lives := make([]life, k)
	ops := make([]op, 0, n)
	for len(ops) < n {
		i := r.IntN(k)
		id := fmt.Sprintf("e%02d", i)
		l := &lives[i]
		var o op
		switch {
		case r.IntN(25) == 0:
			// A bad event: its entry must leave the map until the next valid one.
			o = op{id: id, bad: true, kind: r.IntN(len(badKinds))}
		case !l.exists:
			e := randomEntry(r, id)
			e.Paused = r.IntN(5) == 0
			o = op{id: id, typ: events.TypeEntryRegistered, entry: e}
			l.exists, l.entry = true, e
		default:
			e := l.entry.Clone()
			switch x := r.IntN(10); {
			case x < 4:
				e = randomEntry(r, id)
				e.Paused = l.entry.Paused
				o = op{id: id, typ: events.TypeEntryUpdated, entry: e}
			case x < 6 && !e.Paused:
				e.Paused, e.Note = true, "maintenance"
				o = op{id: id, typ: events.TypeEntryPaused, entry: e}
			case x < 8 && e.Paused:
				e.Paused, e.Note = false, ""
				o = op{id: id, typ: events.TypeEntryResumed, entry: e}
			default:
				e.Removed = true
				if r.IntN(2) == 0 {
					// A removal may name only its entry (how junk ids
					// that never validated are removed).
					e = events.Entry{ID: id, Removed: true}
				}
				o = op{id: id, typ: events.TypeEntryRemoved, entry: e}
				l.exists = false
			}
			if o.typ != events.TypeEntryRemoved {
				l.entry = e
			}
		}
		ops = append(ops, o)
	}
	return ops
}

// publishOps publishes ops in order and fills in their sequences.
func publishOps(t testing.TB, js jetstream.JetStream, ops []op, kinds []func(testing.TB, string) []byte) {
	t.Helper()
	for i := range ops {
		o := &ops[i]
		if o.bad {
			b := kinds[o.kind%len(kinds)](t, o.id)
			o.seq = publishRaw(t, js, testNames.ConfigSubject(o.id), b)
			continue
		}
		o.seq = publishEvent(t, js, o.typ, o.entry)
	}
}

// badKinds are ways to make an event for id that the fold must refuse.
var badKinds = []func(testing.TB, string) []byte{
	func(testing.TB, string) []byte { return []byte("not json \x00\xff") },
	func(t testing.TB, id string) []byte {
		return rawEvent(t, "cronstream.entry.teleported", id, events.Entry{ID: id, Cron: "@daily", Task: events.Task{Type: "x"}})
	},
	func(t testing.TB, id string) []byte {
		return rawEvent(t, events.TypeEntryUpdated, id, events.Entry{ID: id, Cron: "61 * * * *", Task: events.Task{Type: "x"}})
	},
	func(t testing.TB, id string) []byte {
		return rawEvent(t, events.TypeEntryUpdated, id, events.Entry{ID: id + "x", Cron: "@daily", Task: events.Task{Type: "x"}})
	},
	func(t testing.TB, id string) []byte {
		return rawEvent(t, events.TypeEntryUpdated, id, events.Entry{ID: id, Cron: "@daily", Task: events.Task{Type: "x"}, Overlap: "sometimes"})
	},
	func(t testing.TB, id string) []byte {
		// A removal naming another entry than its subject's.
		return rawEvent(t, events.TypeEntryRemoved, id, events.Entry{ID: id + "x", Removed: true})
	},
	func(t testing.TB, id string) []byte {
		// A removal that cannot be read must not leave the entry firing.
		return []byte(`{"specversion":"1.0","id":"x1","type":"cronstream.entry.removed","data":{"id":` + `}`)
	},
}

func TestPropertyLiveAndAsOfEqualReferenceFold(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("CRONSTREAM_TEST_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 4))
	_, js := startNATS(t)
	ops := randomOps(r, 20, 300)

	// A projector that follows the whole history live, with a feed.
	live := startProjector(t, js, Config{})
	feed := recordFeed(t, live)
	half := len(ops) / 2
	publishOps(t, js, ops[:half], badKinds)
	// One that starts halfway: last message per subject, then live.
	mid := startProjector(t, js, Config{})
	publishOps(t, js, ops[half:], badKinds)
	last := ops[len(ops)-1].seq

	ctx := testCtx(t, 30*time.Second)
	want := foldOps(ops)
	for name, p := range map[string]*Projector{"live": live, "mid": mid} {
		if err := p.WaitFor(ctx, last); err != nil {
			t.Fatalf("%s: wait for %d: %v", name, last, err)
		}
		if d := diffStates(t, want, stateMap(p.Entries()), p.Quarantined()); d != "" {
			t.Fatalf("%s projection differs from the reference fold:\n%s", name, d)
		}
		if !p.CaughtUp() {
			t.Fatalf("%s: not caught up", name)
		}
	}
	// A cold start after everything: last message per subject only.
	cold := startProjector(t, js, Config{})
	if err := cold.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if d := diffStates(t, want, stateMap(cold.Entries()), cold.Quarantined()); d != "" {
		t.Fatalf("cold projection differs from the reference fold:\n%s", d)
	}
	if st := live.Stats(); st.LastSeq != last || st.Duplicates != 0 || st.Applied+st.Bad != uint64(len(ops)) {
		t.Fatalf("live stats %+v, want last %d, %d applied+bad, no duplicates", st, last, len(ops))
	}
	feed.check(t, stateMap(live.Entries()))

	// AsOfSeq at random sequences, and at the edges.
	seqs := []uint64{0, 1, last, last + 100}
	for range 12 {
		seqs = append(seqs, 1+r.Uint64N(last))
	}
	for _, s := range seqs {
		got, q, err := AsOfSeq(ctx, js, testNames, s)
		if err != nil {
			t.Fatalf("AsOfSeq(%d): %v", s, err)
		}
		if d := diffStates(t, foldOps(prefixBySeq(ops, s)), got, q); d != "" {
			t.Fatalf("AsOfSeq(%d) differs from the fold of the prefix:\n%s", s, d)
		}
	}

	// AsOfTime at stream timestamps and between them.
	stream, err := js.Stream(ctx, testNames.ConfigStream())
	if err != nil {
		t.Fatal(err)
	}
	for i := range ops {
		m, err := stream.GetMsg(ctx, ops[i].seq)
		if err != nil {
			t.Fatal(err)
		}
		ops[i].at = m.Time
	}
	times := []time.Time{ops[0].at.Add(-time.Second), ops[len(ops)-1].at.Add(time.Hour)}
	for range 12 {
		i := r.IntN(len(ops))
		times = append(times, ops[i].at)
		if i+1 < len(ops) {
			times = append(times, ops[i].at.Add(ops[i+1].at.Sub(ops[i].at)/2))
		}
	}
	for _, at := range times {
		got, q, err := AsOfTime(ctx, js, testNames, at)
		if err != nil {
			t.Fatalf("AsOfTime(%s): %v", at, err)
		}
		if d := diffStates(t, foldOps(prefixByTime(ops, at)), got, q); d != "" {
			t.Fatalf("AsOfTime(%s) differs from the fold of the prefix:\n%s", at.Format(time.RFC3339Nano), d)
		}
	}
}

func prefixBySeq(ops []op, seq uint64) []op {
	for i, o := range ops {
		if o.seq > seq {
			return ops[:i]
		}
	}
	return ops
}

// prefixByTime is every event up to the first one stored after at.
func prefixByTime(ops []op, at time.Time) []op {
	for i, o := range ops {
		if o.at.After(at) {
			return ops[:i]
		}
	}
	return ops
}
