package streamclient

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/testenv"
)

// The same checks run against a single node (R1 streams) and a 3-node
// cluster (R3 streams), which answer a retried publish differently.

func TestSingleNode(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	runBothTopologies(t, func(t *testing.T, prefix string) (jetstream.JetStream, contract.Names) {
		js := n.JetStream(t)
		names := contract.MustNames(prefix)
		if err := EnsureStreams(testCtx(t), js, StreamConfig{Names: names}); err != nil {
			t.Fatal(err)
		}
		return js, names
	}, 1)
}

func TestCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartNATSCluster(t, 3)
	runBothTopologies(t, func(t *testing.T, prefix string) (jetstream.JetStream, contract.Names) {
		js := cl.JetStream(t)
		names := contract.MustNames(prefix)
		if err := EnsureStreams(testCtx(t), js, StreamConfig{Names: names, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(testCtx(t), names.ConfigStream())
		if err != nil || s.CachedInfo().Config.Replicas != 3 {
			t.Fatalf("config stream: %v", err)
		}
		return js, names
	}, 3)

	// A config write rides out the loss of the stream leader: its
	// answers are retried until a new leader is elected.
	t.Run("LeaderLoss", func(t *testing.T) {
		ctx := testCtx(t)
		js := cl.JetStream(t)
		names := contract.MustNames("failover")
		if err := EnsureStreams(ctx, js, StreamConfig{Names: names, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
		c := NewClient(js, names)
		r1, err := c.Put(ctx, validEntry("job"))
		if err != nil {
			t.Fatal(err)
		}
		leader := cl.StreamLeader(t, names.ConfigStream())
		cl.StopNode(leader)
		e := validEntry("job")
		e.Cron = "@daily"
		r2, err := c.Put(ctx, e)
		if err != nil || r2.Type != contract.TypeEntryUpdated || r2.Revision != r1.Revision+1 {
			t.Fatalf("put after losing the leader: %+v %v", r2, err)
		}
		got, rev, err := c.Get(ctx, "job")
		if err != nil || rev != r2.Revision || got.Cron != "@daily" {
			t.Fatalf("get after failover: %+v %d %v", got, rev, err)
		}
	})
}

func runBothTopologies(t *testing.T, setup func(t *testing.T, prefix string) (jetstream.JetStream, contract.Names), replicas int) {
	t.Run("ConcurrentIfRevision", func(t *testing.T) {
		js, names := setup(t, "occ")
		testConcurrentIfRevision(t, js, names)
	})
	t.Run("ConcurrentReadModifyWrite", func(t *testing.T) {
		js, names := setup(t, "rmw")
		testConcurrentReadModifyWrite(t, js, names)
	})
	t.Run("ServerAnswerToRetry", func(t *testing.T) {
		js, names := setup(t, "answer")
		testServerAnswerToRetry(t, js, names, replicas)
	})
	t.Run("StaleState", func(t *testing.T) {
		js, names := setup(t, "stale")
		testStaleState(t, js, names)
	})
	t.Run("AmbiguousRetry", func(t *testing.T) {
		js, names := setup(t, "ambiguous")
		testAmbiguousRetry(t, js, names, replicas)
	})
}

// 8 writers, one expected revision: exactly one wins, the others are told
// the winner's revision.
func testConcurrentIfRevision(t *testing.T, js jetstream.JetStream, names contract.Names) {
	ctx := testCtx(t)
	const writers = 8
	for round := range 3 {
		id := fmt.Sprintf("race-%d", round)
		c := NewClient(js, names)
		base, err := c.Put(ctx, validEntry(id))
		if err != nil {
			t.Fatal(err)
		}
		var (
			start   = make(chan struct{})
			wg      sync.WaitGroup
			results [writers]Result
			errs    [writers]error
		)
		for g := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e := validEntry(id)
				e.Note = fmt.Sprintf("writer %d", g)
				// Each writer has its own connection, as separate
				// processes would.
				wc := NewClient(js, names)
				<-start
				results[g], errs[g] = wc.Put(ctx, e, IfRevision(base.Revision))
			}()
		}
		close(start)
		wg.Wait()

		winner := -1
		for g, err := range errs {
			if err == nil {
				if winner >= 0 {
					t.Fatalf("round %d: writers %d and %d both won", round, winner, g)
				}
				winner = g
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody won: %v", round, errs)
		}
		won := results[winner]
		if won.Type != contract.TypeEntryUpdated || won.Revision <= base.Revision {
			t.Fatalf("round %d: winner result %+v", round, won)
		}
		for g, err := range errs {
			if g == winner {
				continue
			}
			ce := conflictOf(t, err)
			if ce.Current != won.Revision || ce.Expected != base.Revision || ce.Entry != id {
				t.Errorf("round %d writer %d: %+v, want current %d (winner %d)", round, g, ce, won.Revision, winner)
			}
		}
		hist, err := c.History(ctx, id)
		if err != nil || len(hist) != 2 || hist[1].Seq != won.Revision || hist[1].Entry.Note != fmt.Sprintf("writer %d", winner) {
			t.Fatalf("round %d history: %+v %v", round, hist, err)
		}
	}
}

// 8 writers without IfRevision: each retries against the state it lost to,
// so all succeed, one event each.
func testConcurrentReadModifyWrite(t *testing.T, js jetstream.JetStream, names contract.Names) {
	ctx := testCtx(t)
	const writers = 8
	c := NewClient(js, names)
	if _, err := c.Put(ctx, validEntry("shared")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, writers)
	revs := make([]uint64, writers)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := validEntry("shared")
			e.Note = fmt.Sprintf("writer %d", g)
			<-start
			r, err := NewClient(js, names).Put(ctx, e)
			errs[g], revs[g] = err, r.Revision
		}()
	}
	close(start)
	wg.Wait()
	seen := map[uint64]bool{}
	for g, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", g, err)
		}
		if seen[revs[g]] {
			t.Fatalf("two writers report revision %d", revs[g])
		}
		seen[revs[g]] = true
	}
	hist, err := c.History(ctx, "shared")
	if err != nil || len(hist) != writers+1 {
		t.Fatalf("history: %d records, %v; want %d", len(hist), err, writers+1)
	}
}

// testServerAnswerToRetry pins down the server behaviour the client's
// ambiguous-retry handling is built on (see Client.publish): the same
// message published twice with Nats-Msg-Id and an expected last subject
// sequence. R1 refuses the copy with 10071 naming our own sequence; R3
// acknowledges it as a duplicate.
func testServerAnswerToRetry(t *testing.T, js jetstream.JetStream, names contract.Names, replicas int) {
	ctx := testCtx(t)
	subject := names.ConfigSubject("job")
	send := func() (*jetstream.PubAck, error) {
		return js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("x"), Header: nats.Header{}},
			jetstream.WithMsgID("same-id"), jetstream.WithExpectLastSequencePerSubject(0))
	}
	first, err := send()
	if err != nil {
		t.Fatal(err)
	}
	again, err := send()
	switch replicas {
	case 1:
		cur, ok := wrongLastSequence(err)
		if !ok || cur != first.Sequence {
			t.Fatalf("R1 retry: ack %+v err %v; want 10071 wrong last sequence %d", again, err, first.Sequence)
		}
	default:
		if err != nil || !again.Duplicate || again.Sequence != first.Sequence {
			t.Fatalf("R3 retry: ack %+v err %v; want a duplicate ack for sequence %d", again, err, first.Sequence)
		}
	}
}

// testAmbiguousRetry drives the client's publish as a retry whose first
// attempt landed (published by hand with the same event id), and as a
// retry that lost to another writer.
func testAmbiguousRetry(t *testing.T, js jetstream.JetStream, names contract.Names, replicas int) {
	ctx := testCtx(t)
	c := NewClient(js, names)
	base, err := c.Put(ctx, validEntry("job"))
	if err != nil {
		t.Fatal(err)
	}
	subject := names.ConfigSubject("job")
	next := validEntry("job").Normalize()
	next.Cron = "@hourly"
	ev, err := contract.NewEvent(contract.TypeEntryUpdated, "test", "job", next)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := ev.Marshal()

	// Our "first attempt": it landed, but we never saw the ack.
	first, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}},
		jetstream.WithMsgID(ev.ID), jetstream.WithExpectLastSequencePerSubject(base.Revision))
	if err != nil {
		t.Fatal(err)
	}
	seq, err := c.publish(ctx, subject, ev, base.Revision, true)
	if err != nil || seq != first.Sequence {
		t.Fatalf("retry of a publish that landed: seq %d err %v, want success at %d", seq, err, first.Sequence)
	}
	// The same publish not flagged as a retry: R1 answers 10071 and the
	// client, knowing no attempt of its own went out, reports a conflict
	// (it pays the extra read only when an earlier attempt may have
	// landed); R3 answers with a duplicate ack, which is success.
	seq, err = c.publish(ctx, subject, ev, base.Revision, false)
	if replicas == 1 {
		if conflictOf(t, err).Current != first.Sequence {
			t.Fatalf("R1 unflagged copy: %v", err)
		}
	} else if err != nil || seq != first.Sequence {
		t.Fatalf("R3 unflagged copy: seq %d err %v, want duplicate ack at %d", seq, err, first.Sequence)
	}

	// A retry that lost: someone else's event sits after the expected
	// revision. That is a conflict naming their revision.
	mine, _ := contract.NewEvent(contract.TypeEntryUpdated, "test", "job", next)
	seq, err = c.publish(ctx, subject, mine, base.Revision, true)
	if ce := conflictOf(t, err); ce.Current != first.Sequence || seq != 0 {
		t.Fatalf("retry that lost: %+v seq %d", ce, seq)
	}

	got, rev, err := c.Get(ctx, "job")
	if err != nil || rev != first.Sequence || got.Cron != "@hourly" {
		t.Fatalf("after ambiguous retries: %+v %d %v", got, rev, err)
	}
	hist, err := c.History(ctx, "job")
	if err != nil || len(hist) != 2 {
		t.Fatalf("history: %d records %v, want 2 (no duplicate stored)", len(hist), err)
	}
}

// testStaleState: client a remembers the states it wrote; client b changes
// the entries behind its back. Every answer a gives must still be right.
func testStaleState(t *testing.T, js jetstream.JetStream, names contract.Names) {
	ctx := testCtx(t)
	a, b := NewClient(js, names), NewClient(js, names)
	x := validEntry("job")
	y := validEntry("job")
	y.Cron = "@hourly"

	ra, err := a.Put(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Put(ctx, y)
	if err != nil || rb.Type != contract.TypeEntryUpdated {
		t.Fatalf("b's update: %+v %v", rb, err)
	}
	// a still remembers x: putting x again is not a no-op any more.
	r, err := a.Put(ctx, x)
	if err != nil || r.Type != contract.TypeEntryUpdated || r.Revision <= rb.Revision {
		t.Fatalf("a re-puts x after b changed it: %+v %v, want an update after %d", r, err, rb.Revision)
	}
	// b remembers y: putting x (now current) is a no-op at a's revision.
	if r2, err := b.Put(ctx, x); err != nil || r2.Type != "" || r2.Revision != r.Revision {
		t.Fatalf("b puts the current content: %+v %v, want no-op at %d", r2, err, r.Revision)
	}
	// IfRevision against a remembered, outdated revision of b's own
	// write is judged on the current state.
	if _, err := b.Put(ctx, y, IfRevision(rb.Revision)); conflictOf(t, err).Current != r.Revision {
		t.Fatalf("stale IfRevision: %v", err)
	}
	if r3, err := b.Put(ctx, y, IfRevision(r.Revision)); err != nil || r3.Type != contract.TypeEntryUpdated {
		t.Fatalf("IfRevision at the current revision, b's memory older: %+v %v", r3, err)
	}
	// a removes; b, remembering a live entry, is told it is gone.
	if _, err := a.Remove(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pause(ctx, "job", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pause of an entry removed by another client: %v", err)
	}
	if _, _, err := b.Get(ctx, "job"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of an entry removed by another client: %v", err)
	}
	// and b's put registers it again.
	if r4, err := b.Put(ctx, y); err != nil || r4.Type != contract.TypeEntryRegistered {
		t.Fatalf("put after another client removed: %+v %v", r4, err)
	}
	got, rev, err := a.Get(ctx, "job")
	if err != nil || got.Cron != "@hourly" || rev == ra.Revision {
		t.Fatalf("a's get: %+v %d %v", got, rev, err)
	}
	list, err := a.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "job" || list[0].Revision != rev || list[0].Type != contract.TypeEntryRegistered {
		t.Fatalf("a's list: %+v %v, want job at %d", list, err, rev)
	}
}
