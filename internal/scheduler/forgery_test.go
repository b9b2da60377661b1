package scheduler_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

// TestForgedFiresNeverStopAnEntry: a second client publishes fired and
// skipped events on the entry's activity subject, with ids for the tick
// about to come due, for a tick a few seconds ahead and for the year 2100.
// No replica listens to the activity subjects, so nothing published there
// steers the scheduling: every tick keeps firing (each replica is, in turn,
// the last one left, owning the entry's shard), and the relays report the
// two forgeries that took a genuine tick's id before the genuine event
// reached the stream.
func TestForgedFiresNeverStopAnEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const entry = "hello"
	e.put(every(entry, "@every 1s"))
	nodes := []*node{e.startNode("r1", nodeOpts{}), e.startNode("r2", nodeOpts{}), e.startNode("r3", nodeOpts{})}
	testenv.Eventually(t, 15*time.Second, func() bool { return e.taskCount("default") >= 2 }, "the entry to fire")

	forger := e.nats.JetStream(t)
	forge := func(id string) {
		t.Helper()
		m := &nats.Msg{Subject: testNames.FireSubject(entry), Data: []byte(`{"forged":true}`), Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := forger.PublishMsg(testenv.Context(t, 10*time.Second), m); err != nil {
			t.Fatalf("forge %s: %v", id, err)
		}
	}
	unix := func(at time.Time) string { return strconv.FormatInt(at.Unix(), 10) }

	// The tick about to come due, heard a moment before it is.
	current := time.Now().Truncate(time.Second).Add(2 * time.Second)
	waitUntil(t, time.Now, current.Add(-300*time.Millisecond))
	forge("fire:" + entry + ":" + unix(current))
	upcoming := current.Add(4 * time.Second)
	forge("fire:" + entry + ":" + unix(upcoming))
	forge("fire:" + entry + ":4102444800")
	forge("skip:" + entry + ":" + unix(current.Add(2*time.Second)) + "-4102444800")
	from := current.Add(-time.Second)

	// All three, then the last two, then the last one alone.
	phase := 4 * time.Second
	waitUntil(t, time.Now, current.Add(phase+time.Second))
	nodes[0].stop()
	waitUntil(t, time.Now, current.Add(2*phase+time.Second))
	nodes[1].stop()
	fired := nodes[2].counts().Fired
	waitUntil(t, time.Now, current.Add(3*phase+time.Second))
	to := time.Now().Add(-2 * time.Second).Truncate(time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.taskExists("default", schedule.TaskID(testPrefix, entry, to)) },
		"the tick of %s to fire", to.Format(time.TimeOnly))
	if nodes[2].counts().Fired == fired {
		t.Errorf("r3, the last replica left, fired nothing on its own")
	}
	for tick := from; !tick.After(to); tick = tick.Add(time.Second) {
		if !e.taskExists("default", schedule.TaskID(testPrefix, entry, tick)) {
			t.Errorf("tick %s never fired", tick.UTC().Format(time.TimeOnly))
		}
	}

	var forgeries uint64
	testenv.Eventually(t, 10*time.Second, func() bool {
		forgeries = 0
		for _, n := range nodes {
			forgeries += n.relay.Forgeries()
		}
		return forgeries >= 2
	}, "the relays to report the forgeries of %s and %s", current.Format(time.TimeOnly), upcoming.Format(time.TimeOnly))
	if forgeries != 2 {
		t.Errorf("relays report %d forgeries, want 2", forgeries)
	}
}

// TestForgedFireNotRestored: Redis lost its data while a well-formed fired
// event for the year 2100 was the entry's last on its activity subject.
// The replica does not restore the entry's watermark from it: the entry
// fires again.
func TestForgedFireNotRestored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const entry = "w"
	e.put(every(entry, "@every 1s"))
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 2 }, "a to fire")
	a.stop()
	e.waitOutboxEmpty(5*time.Second, "default")

	forgeFire(t, e, entry, time.Unix(4102444800, 0).UTC())
	if err := e.rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return b.counts().Fired >= 2 }, "b to fire after the data loss")
	if b.counts().Implausible == 0 {
		t.Errorf("b did not count the forged fire it refused to restore from")
	}
}

// TestForgedFireNoSignOfLoss: Redis kept the entry's watermark, but a
// well-formed fired event for the year 2100 is the entry's last on its
// activity subject, and the entry is overdue when the next replica loads
// it. A fire far ahead of the clock is no sign that Redis lost fires: the
// replica counts it and loads the entry as it is, never holding it for a
// restore.
func TestForgedFireNoSignOfLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const entry = "w"
	e.put(every(entry, "@every 1s"))
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 2 }, "a to fire")
	a.stop()
	e.waitOutboxEmpty(5*time.Second, "default")
	forgeFire(t, e, entry, time.Unix(4102444800, 0).UTC())
	time.Sleep(2 * time.Second) // the watermark's next tick comes due

	var mu sync.Mutex
	var restoring []string
	b := e.startNode("b", nodeOpts{sched: func(c *scheduler.Config) {
		c.OnOutcome = func(o schedule.Outcome) {
			if errors.Is(o.Err, scheduler.ErrRestoring) {
				mu.Lock()
				restoring = append(restoring, o.Err.Error())
				mu.Unlock()
			}
		}
	}})
	testenv.Eventually(t, 20*time.Second, func() bool { return b.counts().Fired >= 2 }, "b to fire")
	if b.counts().Implausible == 0 {
		t.Errorf("b did not count the forged fire")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(restoring) > 0 {
		t.Errorf("b held the entry for a restore: %q", restoring)
	}
}

// forgeFire publishes a well-formed fired event of entry for tick, as a
// client other than a replica could.
func forgeFire(t *testing.T, e *env, entry string, tick time.Time) {
	t.Helper()
	id := "fire:" + entry + ":" + strconv.FormatInt(tick.Unix(), 10)
	data := eventtest.MarshalAt(t, id, time.Now(), events.TypeEntryFired, "cronstream/forger", entry,
		events.Fired{Entry: entry, ScheduledAt: tick, EnqueuedAt: tick, TaskID: schedule.TaskID(testPrefix, entry, tick), Queue: "default", Replica: "forger"})
	m := &nats.Msg{Subject: testNames.FireSubject(entry), Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, id)
	if _, err := e.js.PublishMsg(testenv.Context(t, 10*time.Second), m); err != nil {
		t.Fatal(err)
	}
}
