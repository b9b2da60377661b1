package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

// failingAck is an outbox whose first acknowledgements fail after the
// records were published: the relay "dies" between the publish and the
// delete, as a crash right after JetStream's ack would.
type failingAck struct {
	relay.Outbox
	failures atomic.Int32
}

func (f *failingAck) AckOutbox(ctx context.Context, prefix, queue, owner string, ttl time.Duration, ids ...string) error {
	if f.failures.Add(-1) >= 0 {
		return errors.New("injected crash before the outbox delete")
	}
	return f.Outbox.AckOutbox(ctx, prefix, queue, owner, ttl, ids...)
}

// TestCrashBetweenRedisWriteAndPublish is INV-outbox: a replica that dies
// after the fire script wrote task and record but before the relay
// published, and a relay that dies after publishing but before deleting the
// records, still leave exactly one event per task in the stream.
func TestCrashBetweenRedisWriteAndPublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	// r1 fires but never publishes: its records stay in the outbox when it
	// dies.
	r1 := e.startNode("r1", nodeOpts{noRelay: true})
	testenv.Eventually(t, 20*time.Second, func() bool { return e.outboxEvents("default") >= 9 }, "r1 to fire a few ticks")
	r1.crash()
	if got := e.readActivity(); len(got) != 0 {
		t.Fatalf("nothing should be published yet, got %d events", len(got))
	}
	left := e.outboxEvents("default")

	// r2's relay publishes everything, but its first two deletes "crash".
	var ob *failingAck
	r2 := e.startNode("r2", nodeOpts{relay: func(c *relay.Config) {
		ob = &failingAck{Outbox: c.Outbox}
		ob.failures.Store(2)
		c.Outbox = ob
	}})
	testenv.Eventually(t, 20*time.Second, func() bool { return ob.failures.Load() < 0 && r2.counts().Fired >= 6 }, "r2 to publish through the injected crashes and fire")
	r2.stop()
	e.waitOutboxEmpty(5*time.Second, "default")

	led := ledgers(e.readActivity())
	for _, id := range ids {
		l := led[id]
		if l == nil {
			t.Fatalf("entry %s has no events", id)
		}
		first, last := l.firedRange()
		checkEverySecond(t, id, l, first, last)
		for s := first; s <= last; s++ {
			task := schedule.TaskID(testPrefix, id, time.Unix(s, 0))
			if n := l.taskIDs[task]; n != 1 {
				t.Errorf("task %s has %d fired events, want 1", task, n)
			}
			if !e.taskExists("default", task) {
				t.Errorf("task %s is not in Redis", task)
			}
		}
	}
	t.Logf("%d events were left by the crashed replica; relay published %d records", left, r2.relay.Published())
	_ = fmt.Sprint
}
