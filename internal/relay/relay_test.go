package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/promtest"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
)

const prefix = "rl"

var names = events.MustNames(prefix)

type env struct {
	t     testing.TB
	nats  *testenv.NATS
	rc    *redis.Client
	store *taskstate.Store
	js    jetstream.JetStream
	n     int // records written so far
}

// newEnv starts Redis and NATS with the streams; dup, when non-zero,
// overrides the activity stream's duplicate window (EnsureStreams refuses
// windows this short).
func newEnv(t testing.TB, dup time.Duration) *env {
	t.Helper()
	return newEnvOn(t, testenv.StartNATS(t), dup)
}

// newEnvOn is newEnv on a NATS server the test started.
func newEnvOn(t testing.TB, n *testenv.NATS, dup time.Duration) *env {
	t.Helper()
	e := &env{t: t, nats: n}
	e.rc = testenv.StartRedis(t).Client(t)
	e.store = taskstate.New(e.rc)
	e.js = e.nats.JetStream(t)
	c := ctx(t, 30*time.Second)
	if err := events.EnsureStreams(c, e.js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	if dup > 0 {
		cfg, err := events.StreamConfig{Names: names}.ActivityStreamConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Duplicates = dup
		if _, err := e.js.UpdateStream(c, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func ctx(t testing.TB, d time.Duration) context.Context { return testenv.Context(t, d) }

func logger(t testing.TB) *slog.Logger { return testlog.Logger(t, slog.LevelWarn) }

// write appends n records (fired events of entry, one task each) to queue's
// outbox through the fire script, as the scheduler does, and returns their
// event ids in outbox order.
func (e *env) write(queue, entry string, n int) []string {
	e.t.Helper()
	fires := make([]taskstate.Fire, 0, n)
	ids := make([]string, 0, n)
	now := time.Now().UTC()
	for range n {
		e.n++
		tick := time.Unix(1_700_000_000+int64(e.n), 0).UTC()
		taskID := fmt.Sprintf("%s:%s:%d", prefix, entry, e.n)
		evID := fmt.Sprintf("fire:%s:%d", entry, tick.Unix())
		fired := events.Fired{Entry: entry, ScheduledAt: tick, EnqueuedAt: now, TaskID: taskID, Queue: queue, Revision: uint64(e.n), Replica: "test"}
		// Every other record in the compact form a scheduled tick's
		// fire writes: the relay reads both.
		b := outbox.AppendFiredRecord(nil, &fired)
		if e.n%2 == 1 {
			ev, err := events.NewEventAt(evID, now, events.TypeEntryFired, "cronstream/test", entry, fired)
			if err != nil {
				e.t.Fatal(err)
			}
			if b, err = ev.Marshal(); err != nil {
				e.t.Fatal(err)
			}
		}
		fires = append(fires, taskstate.Fire{
			Prefix: prefix, Entry: entry, Queue: queue, Kind: taskstate.FireBackfill, Tick: tick,
			Msg: &taskstate.TaskMessage{Type: "t", ID: taskID}, FiredRecord: taskstate.Record{ID: evID, Data: b},
		})
		ids = append(ids, evID)
	}
	res, err := e.store.FireBatch(ctx(e.t, 30*time.Second), taskstate.Fences{}, fires)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range res {
		if r.Status != taskstate.StatusFired {
			e.t.Fatalf("fire: %s", r.Status)
		}
	}
	return ids
}

// stored returns the Nats-Msg-Ids in the activity stream, in order.
func (e *env) stored() []string {
	e.t.Helper()
	var out []string
	for _, m := range testenv.StreamMsgs(e.t, e.js, names.ActivityStream()) {
		out = append(out, m.Header.Get(jetstream.MsgIDHeader))
	}
	return out
}

func (e *env) storedCount() uint64 { return testenv.StreamMsgCount(e.js, names.ActivityStream()) }

func (e *env) outboxLen(queue string) int64 {
	n, err := e.store.OutboxLen(context.Background(), prefix, queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// newRelay returns a relay on its own NATS connection (closed at cleanup)
// and stops it at cleanup.
func (e *env) newRelay(owner string, mod func(*relay.Config)) *relay.Relay {
	e.t.Helper()
	js, err := jetstream.New(e.nats.Connect(e.t, nats.Name(owner)))
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := relay.Config{Outbox: e.store, JS: js, Names: names, Owner: owner, Interval: 50 * time.Millisecond, Batch: 64, Logger: logger(e.t)}
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		c, cancel := context.WithCancel(context.Background())
		cancel()
		_ = r.Stop(c)
	})
	return r
}

// start runs r.
func start(t *testing.T, r *relay.Relay) {
	t.Helper()
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// kill stops r as a crash would: no flush, no lease release.
func kill(r *relay.Relay) {
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	_ = r.Stop(dead)
}

// checkExactlyOnce asserts the stream holds want, each once, in order.
func checkExactlyOnce(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("stream holds %d events, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("event %d is %s, want %s (order or duplicates)", i, got[i], want[i])
		}
	}
}

// TestRelayPublishesInOrder: records of one outbox reach the stream in
// outbox order, with Nats-Msg-Id = event id, and leave the outbox.
func TestRelayPublishesInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	var want []string
	for _, entry := range []string{"a", "b", "c"} {
		want = append(want, e.write("default", entry, 100)...)
	}
	r := e.newRelay("r1", nil)
	start(t, r)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the outbox to drain")
	checkExactlyOnce(t, e.stored(), want)
	if got := r.Published(); got != uint64(len(want)) {
		t.Errorf("Published() = %d, want %d", got, len(want))
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return r.Backlog() == 0 }, "backlog to read 0")
}

// TestRelayOneOwnerAtATime: two relays on one outbox; the lease lets one
// publish, so records go out once and in order.
func TestRelayOneOwnerAtATime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	r1 := e.newRelay("r1", nil)
	r2 := e.newRelay("r2", nil)
	start(t, r1)
	start(t, r2)
	var want []string
	for i := range 20 {
		want = append(want, e.write("default", fmt.Sprintf("e%d", i%4), 25)...)
		r1.Notify()
		r2.Notify()
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the outbox to drain")
	checkExactlyOnce(t, e.stored(), want)
	if p1, p2 := r1.Published(), r2.Published(); p1+p2 != uint64(len(want)) {
		t.Errorf("published %d + %d, want %d in all", p1, p2, len(want))
	}
}

// TestRelayTakeover: the owner dies holding the lease; another relay takes
// the outbox over once the lease lapses and publishes the rest, once.
func TestRelayTakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ttl := time.Second
	r1 := e.newRelay("r1", func(c *relay.Config) { c.LeaseTTL = ttl })
	want := e.write("default", "a", 50)
	start(t, r1)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("default") == 0 }, "r1 to drain")
	// r1 holds the lease from its last pass; it dies with records arriving.
	more := e.write("default", "a", 10)
	kill(r1)
	died := time.Now()
	want = append(want, more...)
	want = append(want, e.write("default", "b", 10)...)
	r2 := e.newRelay("r2", func(c *relay.Config) { c.LeaseTTL = ttl })
	start(t, r2)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("default") == 0 }, "r2 to take over")
	checkExactlyOnce(t, e.stored(), want)
	if r2.Published() == 0 {
		t.Fatal("r2 published nothing")
	}
	t.Logf("r2 took over %s after r1 died (lease %s)", time.Since(died).Round(10*time.Millisecond), ttl)
}

// TestRelayNATSDown: while NATS is down records wait in Redis and the
// backlog says so; when it is back they flow, once each.
func TestRelayNATSDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	r := e.newRelay("r1", func(c *relay.Config) { c.PublishTimeout = time.Second })
	start(t, r)
	want := e.write("default", "a", 20)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the first records to go out")
	e.nats.Shutdown()
	want = append(want, e.write("default", "a", 30)...)
	r.Notify()
	testenv.Eventually(t, 20*time.Second, func() bool { return r.Backlog() == 30 }, "the backlog to show the waiting records (backlog %d)", r.Backlog())
	if n := e.outboxLen("default"); n != 30 {
		t.Fatalf("outbox holds %d records while NATS is down, want 30", n)
	}
	e.nats.Restart(t)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.outboxLen("default") == 0 }, "records to flow after the restart")
	checkExactlyOnce(t, e.stored(), want)
	testenv.Eventually(t, 5*time.Second, func() bool { return r.Backlog() == 0 }, "backlog to read 0")
}

// TestRelayOldRecordsChecked: records published by a relay that died before
// deleting them, and left in the outbox longer than the stream's duplicate
// window, are not published again — although several of them share one
// subject, so the subject's last message names only one. A record's age is
// read by the relay's clock (a replica's, corrected to Redis's): one whose
// host clock is far behind still finds the records old.
func TestRelayOldRecordsChecked(t *testing.T) {
	t.Parallel()
	const window = time.Second
	for _, tc := range []struct {
		name   string
		window time.Duration // the relay's view of the stream's
		now    func() time.Time
	}{
		{"host clock", window, nil},
		{"clock corrected past a slow host's", time.Hour, func() time.Time { return time.Now().Add(2 * time.Hour) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testOldRecordsChecked(t, window, func(c *relay.Config) { c.DuplicateWindow, c.Now = tc.window, tc.now })
		})
	}
}

func testOldRecordsChecked(t *testing.T, window time.Duration, cfg func(*relay.Config)) {
	e := newEnv(t, window)
	ids := e.write("default", "a", 5)
	ids = append(ids, e.write("default", "b", 2)...)
	// A relay published a:1..a:3 and b:1, then died before the deletes.
	c := ctx(t, 10*time.Second)
	recs, err := e.store.ReadOutbox(c, prefix, "default", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	published := map[int]bool{0: true, 1: true, 2: true, 5: true}
	var order []string
	for i, rec := range recs {
		if !published[i] {
			continue
		}
		subj := names.FireSubject(strings.Split(rec.EventID, ":")[1])
		if _, err := e.js.PublishMsg(c, &nats.Msg{Subject: subj, Data: rec.Data, Header: nats.Header{jetstream.MsgIDHeader: []string{rec.EventID}}}); err != nil {
			t.Fatal(err)
		}
		order = append(order, rec.EventID)
	}
	// Past the stream's window and half the relay's: the stream would take
	// a republished record as new.
	stale := time.Now().Add(2 * window)
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(stale) }, "the duplicate window to pass")
	r := e.newRelay("r2", cfg)
	if err := r.Flush(ctx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if !published[i] {
			order = append(order, id)
		}
	}
	checkExactlyOnce(t, e.stored(), order)
	if n := e.outboxLen("default"); n != 0 {
		t.Fatalf("outbox holds %d records", n)
	}
}

// TestRelayFlushLeavesOthersOutboxes: Flush (and so Stop) returns at once
// when the records left belong to an outbox another relay owns, instead of
// spinning until its context ends.
func TestRelayFlushLeavesOthersOutboxes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	e.write("default", "a", 3)
	if ok, err := e.store.AcquireOutbox(context.Background(), prefix, "default", "other", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	r := e.newRelay("r1", nil)
	begin := time.Now()
	if err := r.Flush(ctx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Fatalf("Flush took %s with nothing it could publish", d)
	}
	if got := r.Backlog(); got != 3 {
		t.Fatalf("Backlog() = %d, want 3", got)
	}
	if n := e.storedCount(); n != 0 {
		t.Fatalf("published %d records of an outbox it does not own", n)
	}
}

// TestRelayHold: while Hold says so (a burst of fires), the relay does not
// publish; it never waits longer than MaxHold in a row, and publishes as
// soon as Hold lets go.
func TestRelayHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	var hold atomic.Bool
	hold.Store(true)
	r := e.newRelay("r1", func(c *relay.Config) {
		c.Hold = hold.Load
		c.MaxHold = 1500 * time.Millisecond
	})
	want := e.write("default", "a", 10)
	start(t, r)
	begin := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the relay to publish despite a Hold that never lets go")
	if waited := time.Since(begin); waited < time.Second {
		t.Fatalf("published after %s while held (MaxHold 1.5s)", waited)
	}
	hold.Store(false)
	want = append(want, e.write("default", "b", 10)...)
	r.Notify()
	testenv.Eventually(t, 5*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the relay to publish once Hold lets go")
	checkExactlyOnce(t, e.stored(), want)
}

// TestRelayHoldPastMaxHold: a Hold that lets go only in short gaps (a
// replica with more due than it can fire, its scheduler busy from one pass
// to the next) holds the relay for MaxHold, then no longer until it has
// caught up: the relay publishes whole passes beside the fires instead of
// about one batch per gap or per MaxHold, which let the outbox grow until
// firing paused on its bound.
func TestRelayHoldPastMaxHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	r := e.newRelay("r1", func(c *relay.Config) {
		c.Batch, c.BatchesPerPass = 10, 1
		c.Hold = func() bool { return time.Now().UnixMilli()%500 >= 20 }
		c.MaxHold = time.Second
	})
	// 60 batches: a batch per gap would take 30 s.
	want := e.write("default", "a", 600)
	start(t, r)
	testenv.Eventually(t, 8*time.Second, func() bool { return e.outboxLen("default") == 0 }, "the relay to publish pass after pass once held for MaxHold")
	checkExactlyOnce(t, e.stored(), want)
}

// TestRelayPassBatches: a pass publishes several batches of an outbox in
// order, at most BatchesPerPass, and only one while the scheduler is busy
// (Hold).
func TestRelayPassBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	want := e.write("default", "a", 300)
	var hold atomic.Bool
	hold.Store(true)
	r := e.newRelay("r1", func(c *relay.Config) {
		c.Batch, c.BatchesPerPass = 64, 3
		c.Hold = hold.Load
	})
	c := ctx(t, 30*time.Second)
	for _, step := range []struct {
		hold bool
		n    int
	}{{true, 64}, {false, 3 * 64}, {false, 300 - 4*64}} {
		hold.Store(step.hold)
		n, err := r.Pass(c)
		if err != nil || n != step.n {
			t.Fatalf("pass (held %v): published %d, err %v; want %d", step.hold, n, err, step.n)
		}
	}
	checkExactlyOnce(t, e.stored(), want)
	if left := e.outboxLen("default"); left != 0 {
		t.Fatalf("%d records left in the outbox", left)
	}
}

// TestRelayExpandsCompactRecords: a compact fired record goes to the stream
// as the event's JSON, byte for byte what the full form would have been,
// on the entry's subject.
func TestRelayExpandsCompactRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ids := e.write("q \"one\"", "a", 6)
	c := ctx(t, 20*time.Second)
	recs, err := e.store.ReadOutbox(c, prefix, "q \"one\"", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for _, rec := range recs {
		if outbox.FormOf(rec.Data) == outbox.RecordFired {
			if want[rec.EventID], _, err = outbox.ExpandFiredRecord(nil, rec.EventID, rec.Data, "q \"one\""); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(want) != 3 {
		t.Fatalf("%d compact records written, want 3", len(want))
	}
	r := e.newRelay("r1", nil)
	if err := r.Flush(c); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, e.stored(), ids)
	s, err := e.js.Stream(c, names.ActivityStream())
	if err != nil {
		t.Fatal(err)
	}
	for id, data := range want {
		entry, _, _ := strings.Cut(strings.TrimPrefix(id, "fire:"), ":")
		var found bool
		cons, err := s.OrderedConsumer(c, jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.FireSubject(entry)}})
		if err != nil {
			t.Fatal(err)
		}
		for range ids {
			msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if msg.Headers().Get(jetstream.MsgIDHeader) == id {
				found = true
				if !bytes.Equal(msg.Data(), data) {
					t.Fatalf("event %s stored as\n%s\nwant\n%s", id, msg.Data(), data)
				}
				ev, err := events.DecodeEvent(msg.Data())
				if err != nil || ev.Type != events.TypeEntryFired || ev.Subject != entry {
					t.Fatalf("event %s: %+v, %v", id, ev, err)
				}
				break
			}
		}
		if !found {
			t.Fatalf("event %s not in the stream", id)
		}
	}
}

// TestRelayLeavesNewerRecords: a record in a compact form of a later version
// is history this relay cannot read: it publishes what comes before it and
// leaves it and everything after it in the outbox, never dropping it.
func TestRelayLeavesNewerRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	// More records before it than one batch (64): the pass stops at it
	// in its third batch.
	before := e.write("default", "a", 150)
	c := ctx(t, 20*time.Second)
	newer := taskstate.Fire{
		Prefix: prefix, Entry: "b", Queue: "default", Kind: taskstate.FireBackfill, Tick: time.Unix(1_800_000_000, 0),
		Msg:         &taskstate.TaskMessage{Type: "t", ID: "newer-task"},
		FiredRecord: taskstate.Record{ID: "fire:b:1800000000", Data: []byte("F2 some future layout")},
	}
	if _, err := e.store.FireOnce(c, taskstate.Fences{}, newer); err != nil {
		t.Fatal(err)
	}
	e.write("default", "a", 2)
	r := e.newRelay("r1", nil)
	_, err := r.Pass(c)
	if !errors.Is(err, relay.ErrNewerRecord) {
		t.Fatalf("pass: %v, want ErrNewerRecord", err)
	}
	for range 3 {
		_, _ = r.Pass(c)
	}
	checkExactlyOnce(t, e.stored(), before)
	if n := e.outboxLen("default"); n != 3 {
		t.Fatalf("outbox holds %d records, want the newer one and the two after it", n)
	}
}

// TestRelayReportsForgery: another client publishes, with the id of an
// event still in the outbox, a message of its own; the stream keeps it and
// drops the genuine event as a duplicate. The relay tells that apart from a
// record published before (by a relay that died before deleting it) and
// reports the forgery once, in its metric; the records still leave the
// outbox.
func TestRelayReportsForgery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ids := e.write("default", "a", 3)
	c := ctx(t, 10*time.Second)
	recs, err := e.store.ReadOutbox(c, prefix, "default", "", 1)
	if err != nil || len(recs) != 1 {
		t.Fatalf("read the outbox: %v %v", recs, err)
	}
	// The first record (in the full event form) as its relay published it.
	again := &nats.Msg{Subject: names.FireSubject("a"), Data: recs[0].Data, Header: nats.Header{}}
	again.Header.Set(jetstream.MsgIDHeader, ids[0])
	forged := &nats.Msg{Subject: names.FireSubject("a"), Data: []byte(`{"forged":true}`), Header: nats.Header{}}
	forged.Header.Set(jetstream.MsgIDHeader, ids[1])
	for _, m := range []*nats.Msg{again, forged} {
		if _, err := e.js.PublishMsg(c, m); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	r := e.newRelay("r1", func(c *relay.Config) { c.Metrics = relay.NewMetrics(reg) })
	if _, err := r.Pass(ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := e.outboxLen("default"); n != 0 {
		t.Fatalf("%d records left in the outbox", n)
	}
	if got := r.Forgeries(); got != 1 {
		t.Errorf("Forgeries() = %d, want 1", got)
	}
	if got := promtest.MustValue(t, reg, "cronstream_relay_forgeries_total"); got != 1 {
		t.Errorf("cronstream_relay_forgeries_total = %v, want 1", got)
	}
	checkExactlyOnce(t, e.stored(), ids)
}

// failedRelay returns a relay (lease 20 s) whose last pass published none
// of the 10 records of queue default it returns (the activity stream was
// missing for it, and is back): it has given the outbox up for a while.
func (e *env) failedRelay(c context.Context) (*relay.Relay, []string) {
	e.t.Helper()
	r := e.newRelay("r1", func(c *relay.Config) { c.LeaseTTL, c.PublishTimeout = 20*time.Second, 500*time.Millisecond })
	want := e.write("default", "a", 10)
	if err := e.js.DeleteStream(c, names.ActivityStream()); err != nil {
		e.t.Fatal(err)
	}
	if _, err := r.Pass(c); err == nil {
		e.t.Fatal("a pass without the activity stream published")
	}
	if err := events.EnsureStreams(c, e.js, events.StreamConfig{Names: names}); err != nil {
		e.t.Fatal(err)
	}
	return r, want
}

// TestRelayBackSoonAfterFailedPass: a pass that publishes nothing gives
// the outbox up so another replica may take it, but a lone relay must not
// then leave its backlog for a whole lease period: it is back after about
// a second, and keeps off longer only while its passes keep failing.
func TestRelayBackSoonAfterFailedPass(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	c := ctx(t, 60*time.Second)
	r, want := e.failedRelay(c)
	failed := time.Now()
	if n, _ := r.Pass(c); n != 0 {
		t.Fatalf("the relay took the outbox back at once (%d published): other replicas get no chance", n)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		_, _ = r.Pass(c)
		return e.outboxLen("default") == 0
	}, "the relay to take its outbox back (lease %s)", 20*time.Second)
	t.Logf("back %s after the failed pass", time.Since(failed).Round(10*time.Millisecond))
	checkExactlyOnce(t, e.stored(), want)
}

// TestRelayStopAfterFailedPass: a relay that gave its outbox up after a
// failed pass still publishes it when it stops and no other relay took
// it: the last replica out must not leave its final fires behind for
// having missed one acknowledgement just before.
func TestRelayStopAfterFailedPass(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	c := ctx(t, 60*time.Second)
	r, want := e.failedRelay(c)
	if err := r.Stop(c); err != nil {
		t.Fatal(err)
	}
	if n := e.outboxLen("default"); n != 0 {
		t.Fatalf("stopped with %d records in the outbox, which no other relay holds", n)
	}
	checkExactlyOnce(t, e.stored(), want)
}

// slowReads is an Outbox whose reads take readDelay: a pass that outlasts
// the outbox lease (a loaded host, a Redis far away).
type slowReads struct {
	*taskstate.Store
	readDelay time.Duration
}

func (s slowReads) ReadOutbox(ctx context.Context, prefix, queue, after string, count int) ([]taskstate.OutboxRecord, error) {
	time.Sleep(s.readDelay)
	return s.Store.ReadOutbox(ctx, prefix, queue, after, count)
}

// TestRelayKeepsLeaseThroughLongPass: a pass that takes several lease
// periods keeps its outbox: another relay asking for the lease all along
// never gets it while the pass runs, and the pass deletes every record it
// published. Once the relay stops passing, the lease lapses as before.
func TestRelayKeepsLeaseThroughLongPass(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	const ttl = time.Second
	r := e.newRelay("slow", func(c *relay.Config) {
		c.Outbox, c.LeaseTTL, c.Batch = slowReads{Store: e.store, readDelay: 3 * ttl}, ttl, 32
	})
	want := e.write("default", "a", 20)
	var stolen atomic.Bool
	stop := make(chan struct{})
	thief := make(chan struct{})
	go func() {
		defer close(thief)
		held := false // the thief asks once the pass holds the outbox
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if !held {
				holder, _ := e.rc.Get(context.Background(), taskstate.Own(prefix, "default").OutboxOwner()).Result()
				held = holder == "slow"
				continue
			}
			if ok, err := e.store.AcquireOutbox(context.Background(), prefix, "default", "thief", time.Minute); err == nil && ok {
				stolen.Store(true)
				return
			}
		}
	}()
	c := ctx(t, 60*time.Second)
	for e.outboxLen("default") > 0 && !stolen.Load() {
		if _, err := r.Pass(c); err != nil {
			t.Fatalf("a pass of a relay that kept its lease failed: %v", err)
		}
	}
	close(stop)
	<-thief
	if stolen.Load() {
		t.Fatalf("another relay took the outbox while a pass of %s (lease %s) held it", 3*ttl, ttl)
	}
	checkExactlyOnce(t, e.stored(), want)
	testenv.Eventually(t, 5*time.Second, func() bool {
		ok, err := e.store.AcquireOutbox(context.Background(), prefix, "default", "next", time.Minute)
		return err == nil && ok
	}, "the lease to lapse once the relay stopped passing")
}

// failingReads is an Outbox whose next fail reads return an error, as a
// Redis that times out once does.
type failingReads struct {
	*taskstate.Store
	fail *atomic.Int32
}

func (f failingReads) ReadOutbox(ctx context.Context, prefix, queue, after string, count int) ([]taskstate.OutboxRecord, error) {
	if f.fail.Add(-1) >= 0 {
		return nil, errors.New("read timed out")
	}
	return f.Store.ReadOutbox(ctx, prefix, queue, after, count)
}

// TestRelayStopRetriesFailedPass: a stop whose first flush pass fails
// tries once more and leaves nothing behind; two failures in a row end
// the flush with the error, the records left for the next relay.
func TestRelayStopRetriesFailedPass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fails int32
		left  int64
	}{{1, 0}, {2, 10}} {
		t.Run(fmt.Sprintf("fails=%d", tc.fails), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 0)
			fail := &atomic.Int32{}
			r := e.newRelay("r1", func(c *relay.Config) { c.Outbox = failingReads{Store: e.store, fail: fail} })
			want := e.write("default", "a", 10)
			if _, err := r.Pass(ctx(t, 10*time.Second)); err != nil { // the relay has passed: its stop flushes
				t.Fatal(err)
			}
			want = append(want, e.write("default", "a", 10)...)
			fail.Store(tc.fails)
			err := r.Stop(ctx(t, 30*time.Second))
			if n := e.outboxLen("default"); n != tc.left {
				t.Fatalf("stopped with %d records in the outbox (err %v), want %d", n, err, tc.left)
			}
			if (err != nil) != (tc.left > 0) {
				t.Errorf("Stop = %v with %d records left", err, tc.left)
			}
			if tc.left == 0 {
				checkExactlyOnce(t, e.stored(), want)
			}
		})
	}
}
