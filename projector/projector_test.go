package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestPoisonEventsQuarantineOnlyTheirEntry(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	logs := &logCapture{}
	p := startProjector(t, js, Config{Logger: slog.New(logs)})
	ctx := testCtx(t, 30*time.Second)

	victims := []string{"garbage", "unknowntype", "badcron", "mismatch", "oversized", "badremove", "newenum"}
	for _, id := range append([]string{"g1", "g2"}, victims...) {
		publishEvent(t, js, events.TypeEntryRegistered, validEntry(id))
	}
	withCron := func(id, cron string) events.Entry { e := validEntry(id); e.Cron = cron; return e }
	newEnum := validEntry("newenum")
	newEnum.Catchup.Policy = "smart"
	oversized := validEntry("oversized")
	oversized.Note = strings.Repeat("n", 1000*1000) // near the 1 MiB max payload; too long a note
	big := validEntry("g2")
	big.Task.Payload = make([]byte, 700*1000) // valid: 933 kB of base64 in the event

	badSeqs := map[uint64]string{}
	bad := func(id string, data []byte) { badSeqs[publishRaw(t, js, testNames.ConfigSubject(id), data)] = id }
	bad("garbage", []byte("\x00\x01 definitely not an event"))
	publishEvent(t, js, events.TypeEntryUpdated, withCron("g1", "@hourly"))
	bad("unknowntype", rawEvent(t, "cronstream.entry.hibernated", "unknowntype", validEntry("unknowntype")))
	bad("badcron", rawEvent(t, events.TypeEntryUpdated, "badcron", withCron("badcron", "* * * * * * *")))
	bad("mismatch", rawEvent(t, events.TypeEntryUpdated, "mismatch", validEntry("g1")))
	bad("oversized", rawEvent(t, events.TypeEntryUpdated, "oversized", oversized))
	bigSeq := publishEvent(t, js, events.TypeEntryUpdated, big)
	bad("badremove", []byte(`{"specversion":"1.0","id":"r1","type":"cronstream.entry.removed","data":{"id":"badremove","removed":tru`))
	bad("newenum", rawEvent(t, events.TypeEntryUpdated, "newenum", newEnum))
	// A subject token that is no valid id quarantines what it names.
	badSeqs[publishRaw(t, js, "pt.config.not~an~id", rawEvent(t, events.TypeEntryUpdated, "x", validEntry("x")))] = "not~an~id"
	ignoredSeqs := []uint64{publishRaw(t, js, "pt.config.two.tokens", []byte("garbage"))}
	last := publishEvent(t, js, events.TypeEntryUpdated, withCron("g1", "@daily"))
	if err := p.WaitFor(ctx, last); err != nil {
		t.Fatalf("projector stalled: %v (at %d, stats %+v)", err, p.LastSeq(), p.Stats())
	}

	if g1, ok := p.Get("g1"); !ok || g1.Revision != last || g1.Entry.Cron != "@daily" {
		t.Fatalf("g1 = %+v, %v: good events after bad ones must apply", g1, ok)
	}
	if g2, ok := p.Get("g2"); !ok || g2.Revision != bigSeq || len(g2.Entry.Task.Payload) != 700*1000 {
		t.Fatalf("g2 at rev %d, want the large valid event %d applied", g2.Revision, bigSeq)
	}
	for _, id := range victims {
		if _, ok := p.Get(id); ok {
			t.Errorf("%s still in the map after a bad event", id)
		}
	}
	q := p.Quarantined()
	if len(q) != len(victims)+1 {
		t.Fatalf("quarantined %+v, want %v and not~an~id", q, victims)
	}
	for _, e := range q {
		if badSeqs[e.Seq] != e.ID || e.Reason == "" {
			t.Errorf("quarantine %+v does not name its bad event", e)
		}
	}
	st := p.Stats()
	if st.Bad != uint64(len(victims)+1) || st.Ignored != 1 || st.Entries != 2 || st.Quarantined != len(victims)+1 {
		t.Fatalf("stats %+v", st)
	}
	logged := logs.seqsLogged()
	for seq := range badSeqs {
		if logged[seq] != 1 {
			t.Errorf("bad event %d logged %d times, want once", seq, logged[seq])
		}
	}
	for _, seq := range ignoredSeqs {
		if logged[seq] != 1 {
			t.Errorf("ignored message %d logged %d times, want once", seq, logged[seq])
		}
	}

	// Point in time agrees with the live view.
	asOf, asOfQ, err := AsOfSeq(ctx, js, testNames, last)
	if err != nil {
		t.Fatal(err)
	}
	if len(asOf) != 2 || fmt.Sprint(asOfQ) != fmt.Sprint(q) {
		t.Fatalf("AsOfSeq: %d entries, quarantined %+v; live %+v", len(asOf), asOfQ, q)
	}

	// A valid event for each brings it back (a valid removal clears it too,
	// also of an id no valid event can register).
	fixed := publishRaw(t, js, "pt.config.not~an~id", rawEvent(t, events.TypeEntryRemoved, "not~an~id", events.Entry{ID: "not~an~id", Removed: true}))
	for _, id := range victims {
		if id == "badremove" {
			e := validEntry(id)
			e.Removed = true
			fixed = publishEvent(t, js, events.TypeEntryRemoved, e)
			continue
		}
		fixed = publishEvent(t, js, events.TypeEntryUpdated, validEntry(id))
	}
	if err := p.WaitFor(ctx, fixed); err != nil {
		t.Fatal(err)
	}
	if q := p.Quarantined(); len(q) != 0 {
		t.Fatalf("still quarantined after valid events: %+v", q)
	}
	if n := p.Len(); n != 2+len(victims)-1 {
		t.Fatalf("%d entries, want %d", n, 2+len(victims)-1)
	}
}

func TestWaitForReadsOwnWrite(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	p := startProjector(t, js, Config{})
	ctx := testCtx(t, 10*time.Second)
	for i := range 20 {
		e := validEntry(fmt.Sprintf("w%d", i%3))
		typ := events.TypeEntryUpdated
		if i%2 == 1 {
			e.Paused, typ = true, events.TypeEntryPaused
		}
		seq := publishEvent(t, js, typ, e)
		if err := p.WaitFor(ctx, seq); err != nil {
			t.Fatal(err)
		}
		got, ok := p.Get(e.ID)
		if !ok || got.Revision != seq || got.Entry.Paused != e.Paused {
			t.Fatalf("after WaitFor(%d): %+v, %v", seq, got, ok)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := p.WaitFor(short, p.LastSeq()+1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitFor beyond the stream: %v, want deadline exceeded", err)
	}
}

func TestCaughtUp(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	empty := startProjector(t, js, Config{})
	if !empty.CaughtUp() {
		t.Fatal("a projector of an empty stream must be caught up at once")
	}

	const entries, perEntry = 1000, 3
	ctx := testCtx(t, 60*time.Second)
	for round := range perEntry {
		batch := make([]events.Entry, entries)
		for i := range batch {
			batch[i] = validEntry(fmt.Sprintf("cu%04d", i))
			batch[i].Note = fmt.Sprint("round ", round)
		}
		eventtest.Publish(t, js, testNames, events.TypeEntryUpdated, "test", batch, 60*time.Second)
	}
	if err := empty.WaitFor(ctx, entries*perEntry); err != nil {
		t.Fatal(err)
	}

	p := startProjector(t, js, Config{})
	if p.CaughtUp() {
		t.Fatal("caught up right after Start, before loading 1000 entries")
	}
	if err := p.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if !p.CaughtUp() || p.Len() != entries || st.LastSeq != entries*perEntry {
		t.Fatalf("caught up with %d entries at seq %d", p.Len(), st.LastSeq)
	}
	// The initial load read the last message per entry, not the history.
	if st.Applied != entries {
		t.Fatalf("initial load applied %d events for %d entries: it read history", st.Applied, entries)
	}
	if got, _ := p.Get("cu0007"); got.Entry.Note != "round 2" {
		t.Fatalf("cu0007 = %+v, want its last state", got)
	}
}

// TestSubscriptionRemoved: a subscription started after removals names
// them with the last state their events carried; an entry registered
// again, or quarantined, since is not among them.
func TestSubscriptionRemoved(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	var last uint64
	for _, id := range []string{"gone", "back", "junk"} {
		e := validEntry(id)
		e.Task.Payload, e.Task.Headers, e.Note = []byte(`{"big":"payload"}`), map[string]string{"h": "v"}, "a note"
		publishEvent(t, js, events.TypeEntryRegistered, e)
		e.Removed = true
		last = publishEvent(t, js, events.TypeEntryRemoved, e)
	}
	publishEvent(t, js, events.TypeEntryRegistered, validEntry("back"))
	last = publishRaw(t, js, testNames.ConfigSubject("junk"), []byte("not an event"))
	p := startProjector(t, js, Config{})
	if err := p.WaitFor(testCtx(t, 10*time.Second), last); err != nil {
		t.Fatal(err)
	}
	sub := p.Subscribe()
	defer sub.Close()
	rm := sub.Removed()
	if len(rm) != 1 || rm[0].ID != "gone" || rm[0].New != nil || rm[0].Old == nil || rm[0].Old.Entry.Cron != validEntry("gone").Cron || rm[0].Time.IsZero() {
		t.Fatalf("removed %+v, want only gone's removal with its last state", rm)
	}
	// What the entry's tasks carried is not kept for a removed entry.
	if e := rm[0].Old.Entry; e.Task.Payload != nil || e.Task.Headers != nil || e.Note != "" || e.Options.QueueName() != validEntry("gone").Options.QueueName() {
		t.Fatalf("removed gone keeps %+v", e)
	}
}

// TestSubscriptionKeepsStops: a subscriber that reads late gets an entry's
// removal, or quarantine, and the registration that followed it as two
// changes, not one update; an entry that came and went meanwhile is still
// coalesced away.
func TestSubscriptionKeepsStops(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	publishEvent(t, js, events.TypeEntryRegistered, validEntry("a"))
	last := publishEvent(t, js, events.TypeEntryRegistered, validEntry("b"))
	p := startProjector(t, js, Config{})
	ctx := testCtx(t, 10*time.Second)
	if err := p.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}
	sub := p.Subscribe()
	defer sub.Close()
	if batch, err := sub.Next(ctx); err != nil || len(batch) != 2 {
		t.Fatalf("snapshot %+v, %v; want a and b", batch, err)
	}

	a := validEntry("a")
	a.Removed = true
	removedA := publishEvent(t, js, events.TypeEntryRemoved, a)
	a = validEntry("a")
	a.Note = "back"
	publishEvent(t, js, events.TypeEntryRegistered, a)
	a.Note = "back, edited"
	lastA := publishEvent(t, js, events.TypeEntryUpdated, a)
	quarantinedB := publishRaw(t, js, testNames.ConfigSubject("b"), []byte("not an event"))
	lastB := publishEvent(t, js, events.TypeEntryUpdated, validEntry("b"))
	tmp := validEntry("tmp")
	publishEvent(t, js, events.TypeEntryRegistered, tmp)
	tmp.Removed = true
	last = publishEvent(t, js, events.TypeEntryRemoved, tmp)
	if err := p.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}

	batch, err := sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range batch {
		got = append(got, fmt.Sprintf("%s old=%v new=%v seq=%d q=%v", c.ID, c.Old != nil, c.New != nil, c.Seq, c.Quarantined))
	}
	want := []string{
		fmt.Sprintf("a old=true new=false seq=%d q=false", removedA),
		fmt.Sprintf("a old=false new=true seq=%d q=false", lastA),
		fmt.Sprintf("b old=true new=false seq=%d q=true", quarantinedB),
		fmt.Sprintf("b old=false new=true seq=%d q=false", lastB),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if batch[0].Time.IsZero() || batch[1].New.Entry.Note != "back, edited" {
		t.Errorf("a's removal has no time, or its registration is not its last state: %+v", batch)
	}
}

func TestSlowSubscriberDoesNotBlockAndGetsCoalescedChanges(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	p := startProjector(t, js, Config{})
	ctx := testCtx(t, 30*time.Second)
	sub := p.Subscribe()
	defer sub.Close()

	// The subscriber reads nothing while 300 events are applied.
	var last uint64
	for i := range 300 {
		e := validEntry(fmt.Sprintf("s%d", i%5))
		e.Note = fmt.Sprint(i)
		last = publishEvent(t, js, events.TypeEntryUpdated, e)
	}
	tmp := validEntry("tmp")
	publishEvent(t, js, events.TypeEntryRegistered, tmp)
	tmp.Removed = true
	last = publishEvent(t, js, events.TypeEntryRemoved, tmp)
	if err := p.WaitFor(ctx, last); err != nil {
		t.Fatalf("projector blocked by a subscriber that does not read: %v", err)
	}

	batch, err := sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != 5 {
		t.Fatalf("got %d changes, want one per entry (5); tmp came and went unseen: %+v", len(batch), batch)
	}
	for i, c := range batch {
		cur, _ := p.Get(c.ID)
		if c.Old != nil || c.New == nil || c.New.Revision != cur.Revision || c.Seq != cur.Revision {
			t.Fatalf("change %+v, want from nothing to the current state rev %d", c, cur.Revision)
		}
		if i > 0 && c.Seq <= batch[i-1].Seq {
			t.Fatalf("changes not in stream order: %+v", batch)
		}
	}
	prev, _ := p.Get("s0")
	e := validEntry("s0")
	seq := publishEvent(t, js, events.TypeEntryUpdated, e)
	batch, err = sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != 1 || batch[0].Old == nil || batch[0].Old.Revision != prev.Revision || batch[0].New.Revision != seq {
		t.Fatalf("next change %+v, want s0 from rev %d to %d", batch, prev.Revision, seq)
	}

	sub.Close()
	if _, err := sub.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}

func TestLastHeardFollowsHeartbeatsAndOutage(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	p := startProjector(t, n.JetStream(t), Config{Heartbeat: 500 * time.Millisecond})
	ctx := testCtx(t, 60*time.Second)
	if err := p.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	start := p.LastHeard()
	testenv.Eventually(t, 10*time.Second, func() bool { return p.LastHeard().After(start.Add(time.Second)) },
		"LastHeard moves on a silent stream (heartbeats)")

	n.Shutdown()
	down := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Since(p.LastHeard()) > 3*time.Second },
		"LastHeard stops moving while the server is down (last %s)", lazy(func() string { return p.LastHeard().String() }))
	if h := p.LastHeard(); h.After(down) {
		t.Fatalf("LastHeard %s claims the stream was heard after the server went down at %s", h, down)
	}

	n.Restart(t)
	testenv.Eventually(t, 15*time.Second, func() bool { return time.Since(p.LastHeard()) < 2*time.Second },
		"LastHeard moves again after the restart")
	seq := publishEvent(t, js, events.TypeEntryRegistered, validEntry("after"))
	if err := p.WaitFor(ctx, seq); err != nil {
		t.Fatal(err)
	}
	if p.Err() != nil {
		t.Fatalf("projector ended: %v", p.Err())
	}
}

func TestClosedConnectionEndsProjection(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	publishEvent(t, js, events.TypeEntryRegistered, validEntry("a"))
	nc := n.Connect(t)
	pjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p := startProjector(t, pjs, Config{})
	ctx := testCtx(t, 10*time.Second)
	if err := p.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	sub := p.Subscribe()
	defer sub.Close()
	nc.Close()
	testenv.Eventually(t, 10*time.Second, func() bool { return p.Err() != nil }, "projector reports its closed connection")
	// The change pushed before the end is still delivered, then ErrStopped.
	if batch, err := sub.Next(ctx); err != nil || len(batch) != 1 {
		t.Fatalf("Next: %v, %v", batch, err)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("Next after the end: %v, want ErrStopped", err)
	}
	if err := p.WaitFor(ctx, 99); !errors.Is(err, ErrStopped) {
		t.Fatalf("WaitFor after the end: %v, want ErrStopped", err)
	}
	if _, ok := p.Get("a"); !ok {
		t.Fatal("the map must stay readable after the end")
	}
}

func TestStartAndStop(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	ctx := testCtx(t, 10*time.Second)

	missing := mustNew(t, Config{JS: js, Names: events.MustNames("nostream")})
	if err := missing.Start(ctx); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Start without a stream: %v, want ErrStreamNotFound", err)
	}
	_ = missing.Stop(ctx)

	p := mustNew(t, Config{JS: js, Names: testNames, Logger: testLogger(t)})
	_ = p.Stop(ctx) // before Start: harmless
	if err := p.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after Stop: %v, want ErrStopped", err)
	}

	q := startProjector(t, js, Config{})
	if err := q.Start(ctx); !errors.Is(err, ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	_ = q.Stop(ctx)
	_ = q.Stop(ctx)
	if err := q.WaitFor(ctx, 1); !errors.Is(err, ErrStopped) {
		t.Fatalf("WaitFor after Stop: %v", err)
	}
}

// TestSubscriptionSnapshot: a subscriber taking shards over mid-stream
// gets their registered entries and removals as of one moment, and a mark
// that tells the batches it may still hold (older than the snapshot) from
// the later ones; Queues lists the queues of registered and removed
// entries, and forgets a queue no entry uses.
func TestSubscriptionSnapshot(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	inQueue := func(id, q string) events.Entry {
		e := validEntry(id)
		e.Options.Queue = q
		return e
	}
	publishEvent(t, js, events.TypeEntryRegistered, inQueue("a", "q1"))
	publishEvent(t, js, events.TypeEntryRegistered, inQueue("b", "q2"))
	gone := inQueue("gone", "q3")
	publishEvent(t, js, events.TypeEntryRegistered, gone)
	gone.Removed = true
	last := publishEvent(t, js, events.TypeEntryRemoved, gone)
	p := startProjector(t, js, Config{})
	ctx := testCtx(t, 10*time.Second)
	if err := p.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}
	if qs := p.Queues(); !slices.Equal(qs, []string{"q1", "q2", "q3"}) {
		t.Fatalf("queues %v", qs)
	}
	sub := p.Subscribe()
	defer sub.Close()
	first, n1, err := sub.NextMarked(ctx)
	if err != nil || n1 != 1 || len(first) != 2 {
		t.Fatalf("first batch %+v #%d, %v", first, n1, err)
	}
	// a changes after the first batch was taken; the subscriber has not
	// read it yet when it takes q1 and q3 over.
	a := inQueue("a", "q1")
	a.Note = "edited"
	lastA := publishEvent(t, js, events.TypeEntryUpdated, a)
	if err := p.WaitFor(ctx, lastA); err != nil {
		t.Fatal(err)
	}
	reg, rm, mark := sub.Snapshot(func(s events.Shard) bool { return s.Queue == "q1" || s.Queue == "q3" })
	if mark != n1 {
		t.Errorf("mark %d, want %d", mark, n1)
	}
	if len(reg) != 1 || reg[0].ID != "a" || reg[0].Old != nil || reg[0].New.Entry.Note != "edited" || reg[0].Seq != lastA {
		t.Errorf("registered %+v", reg)
	}
	if len(rm) != 1 || rm[0].ID != "gone" || rm[0].New != nil || rm[0].Old == nil || rm[0].Seq != last {
		t.Errorf("removed %+v", rm)
	}
	// The pending change comes in a later batch, at the state the
	// snapshot holds.
	next, n2, err := sub.NextMarked(ctx)
	if err != nil || n2 <= mark || len(next) != 1 || next[0].New.Entry.Note != "edited" {
		t.Errorf("batch after the snapshot %+v #%d, %v", next, n2, err)
	}
	b := inQueue("b", "q2")
	b.Removed = true
	publishEvent(t, js, events.TypeEntryRemoved, b)
	moved := inQueue("a", "q3")
	lastA = publishEvent(t, js, events.TypeEntryUpdated, moved)
	if err := p.WaitFor(ctx, lastA); err != nil {
		t.Fatal(err)
	}
	if qs := p.Queues(); !slices.Equal(qs, []string{"q2", "q3"}) {
		t.Errorf("queues after a's move and b's removal %v, want q2 (b's last) and q3", qs)
	}
}
