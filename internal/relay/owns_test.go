package relay_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/testenv"
)

// owners is which relay owns which queue, as a test moves them.
type owners struct {
	mu sync.Mutex
	by map[string]string // queue -> relay
}

func (o *owners) set(queue, relay string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.by[queue] = relay
}

func (o *owners) of(relay string) func(string) bool {
	return func(q string) bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.by[q] == relay
	}
}

// TestRelayOwnedQueues: with ownership each relay publishes the outboxes
// of the queues its replica owns and no other; a queue that moves to
// another owner has its outbox released by the old one and published by
// the new; an owner killed holding its outboxes leaves them to any relay
// once their lease lapsed and their oldest record waited OrphanAfter (the
// queues' new owners not known yet), each record once and in order.
func TestRelayOwnedQueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	own := &owners{by: map[string]string{"a": "r1", "b": "r2"}}
	orphans := relay.NewMetrics(nil)
	tune := func(id string, m *relay.Metrics) func(*relay.Config) {
		return func(c *relay.Config) {
			c.Owns, c.LeaseTTL, c.OrphanAfter, c.Metrics = own.of(id), time.Second, 500*time.Millisecond, m
		}
	}
	r1 := e.newRelay("r1", tune("r1", relay.NewMetrics(nil)))
	r2 := e.newRelay("r2", tune("r2", orphans))
	start(t, r1)
	start(t, r2)
	var want []string
	want = append(want, e.write("a", "x", 20)...)
	want = append(want, e.write("b", "y", 20)...)
	// A relay counts its records once their outbox entries are deleted:
	// wait for both.
	testenv.Eventually(t, 20*time.Second, func() bool {
		return e.outboxLen("a")+e.outboxLen("b") == 0 && r1.Published()+r2.Published() >= 40
	}, "the outboxes to drain")
	if p1, p2 := r1.Published(), r2.Published(); p1 != 20 || p2 != 20 {
		t.Errorf("r1 published %d, r2 %d: want 20 each, its own queue's", p1, p2)
	}

	// b moves to r1: r2 lets its outbox go, r1 publishes it.
	own.set("b", "r1")
	want = append(want, e.write("b", "y", 20)...)
	r1.Notify()
	r2.Notify()
	testenv.Eventually(t, 20*time.Second, func() bool {
		return e.outboxLen("b") == 0 && r1.Published()+r2.Published() >= 60
	}, "b's outbox to drain after the move")
	if p1, p2 := r1.Published(), r2.Published(); p1 != 40 || p2 != 20 {
		t.Errorf("after the move r1 published %d, r2 %d: want 40 and 20", p1, p2)
	}

	// r1 dies holding both outboxes, records arriving; their shards are
	// not taken over yet (nobody owns them): r2 relays them as orphans.
	want = append(want, e.write("a", "x", 10)...)
	kill(r1)
	died := time.Now()
	want = append(want, e.write("a", "x", 10)...)
	want = append(want, e.write("b", "y", 10)...)
	own.set("a", "")
	own.set("b", "")
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("a")+e.outboxLen("b") == 0 }, "r2 to relay the orphaned outboxes")
	took := time.Since(died)
	t.Logf("orphaned outboxes drained %s after their relay died (lease 1s, orphan after 500ms)", took.Round(10*time.Millisecond))
	got := e.stored()
	checkSameOnce(t, got, want)
	var m dto.Metric
	if err := orphans.Orphans.Write(&m); err != nil || m.GetCounter().GetValue() == 0 {
		t.Errorf("orphan passes counted %v (%v), want some", m.GetCounter().GetValue(), err)
	}
}

// checkSameOnce asserts the stream holds want, each once, each queue's in
// its order (the queues' outboxes are relayed independently).
func checkSameOnce(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("stream holds %d events, want %d", len(got), len(want))
	}
	for _, entry := range []string{"x", "y"} {
		sub := func(ids []string) []string {
			return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !containsEntry(id, entry) })
		}
		if g, w := sub(got), sub(want); !slices.Equal(g, w) {
			t.Fatalf("entry %s: stream holds %v, want %v", entry, g, w)
		}
	}
}

func containsEntry(id, entry string) bool { return strings.HasPrefix(id, "fire:"+entry+":") }

// TestRelayOwnerCutOffFromNATS: the relay of a queue's owner loses NATS
// while Redis stays (its replica still holds the queue until its shards
// lapse): it yields the outbox, and a relay that reaches NATS, owning no
// queue, publishes it once its records waited OrphanAfter, each once and
// in order.
func TestRelayOwnerCutOffFromNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	own := &owners{by: map[string]string{"a": "r1"}}
	nc := e.nats.Connect(t, nats.Name("r1"))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := relay.New(relay.Config{Outbox: e.store, JS: js, Names: names, Owner: "r1", Interval: 50 * time.Millisecond, Batch: 64,
		Owns: own.of("r1"), OrphanAfter: 500 * time.Millisecond, PublishTimeout: time.Second, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kill(r1) })
	r2 := e.newRelay("r2", func(c *relay.Config) { c.Owns, c.OrphanAfter = own.of("r2"), 500*time.Millisecond })
	start(t, r1)
	start(t, r2)
	want := e.write("a", "x", 20)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("a") == 0 }, "the owner to publish its outbox")
	if r2.Published() != 0 {
		t.Fatalf("r2 published %d records of a queue it does not own", r2.Published())
	}
	nc.Close()
	cut := time.Now()
	want = append(want, e.write("a", "x", 20)...)
	r1.Notify()
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxLen("a") == 0 }, "another relay to publish the cut-off owner's outbox")
	t.Logf("published by r2 %s after r1 lost NATS (orphan after 500ms)", time.Since(cut).Round(10*time.Millisecond))
	checkExactlyOnce(t, e.stored(), want)
	if r2.Published() != 20 {
		t.Errorf("r2 published %d, want the 20 written after the cut", r2.Published())
	}
}

// TestRelayStopTakesFreeOutboxes: a relay stopping publishes the outboxes
// of queues it does not own when no relay holds them (their last holder
// stopped before it, and the last replica out must not leave its final
// fires behind), and leaves alone an outbox another relay holds.
func TestRelayStopTakesFreeOutboxes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	own := &owners{by: map[string]string{"a": "gone", "b": "other"}}
	r := e.newRelay("r1", func(c *relay.Config) {
		c.Owns, c.OrphanAfter = own.of("r1"), time.Hour
	})
	want := e.write("a", "x", 30)
	e.write("b", "y", 5)
	if ok, err := e.store.AcquireOutbox(context.Background(), prefix, "b", "other", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	start(t, r)
	// Running, it publishes neither: it owns neither queue, and a's
	// records have not waited an hour.
	time.Sleep(300 * time.Millisecond)
	if n := e.storedCount(); n != 0 {
		t.Fatalf("published %d records of queues it does not own", n)
	}
	if err := r.Stop(ctx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	checkSameOnce(t, e.stored(), want)
	if n := e.outboxLen("b"); n != 5 {
		t.Errorf("b's outbox holds %d records, want its 5 (another relay holds it)", n)
	}
	if ok, err := e.store.AcquireOutbox(context.Background(), prefix, "a", "next", time.Minute); err != nil || !ok {
		t.Errorf("a's outbox lease not released on stop: %v %v", ok, err)
	}
}
