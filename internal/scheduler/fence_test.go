package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
)

// skewedProjection is a live projection that reports an older sequence or
// an older "last heard" than it has: a replica whose view of the config
// stream is behind.
type skewedProjection struct {
	*projector.Projector
	seq   func() uint64
	heard func() time.Time
}

func (p skewedProjection) LastSeq() uint64 {
	if p.seq != nil {
		return p.seq()
	}
	return p.Projector.LastSeq()
}

func (p skewedProjection) FenceSeq() uint64 {
	if p.seq != nil {
		return p.seq()
	}
	return p.Projector.FenceSeq()
}

func (p skewedProjection) LastHeard() time.Time {
	if p.heard != nil {
		return p.heard()
	}
	return p.Projector.LastHeard()
}

// TestRevisionFence: once a replica fired from a newer configuration, a
// replica whose projection is older cannot fire into the same queue; the
// up-to-date replica fires every tick.
func TestRevisionFence(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var ids []string
	for i := range 6 {
		id := fmt.Sprintf("f%d", i)
		ids = append(ids, id)
		e.put(every(id, "@every 1s"))
	}
	old := e.put(every("bump", "@every 1h")) - 1
	// Both replicas try every tick (no shard ownership, on one manual
	// clock): each of b's attempts meets the fence a raised.
	mt := newManualTime(t)
	a := mt.startNode(e, "a", nodeOpts{})
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return a.counts().Fired >= 6 }, "a to fire")
	b := mt.startNode(e, "b", nodeOpts{projection: func(p *projector.Projector) scheduler.Projection {
		return skewedProjection{Projector: p, seq: func() uint64 { return old }}
	}})
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return b.counts().Refused["revision-fenced"] >= 3 }, "b's fires to be fenced (b %+v)", b.counts())
	if n := b.counts().Fired; n != 0 {
		t.Errorf("b fired %d ticks from an older configuration", n)
	}
	b.stop()
	a.stop()
	e.waitOutboxEmpty(5*time.Second, "default")
	led := ledgers(e.readActivity())
	for _, id := range ids {
		first, last := led[id].firedRange()
		checkEverySecond(t, id, led[id], first, last)
		if len(led[id].skipped) > 0 {
			t.Errorf("%s: skipped %+v", id, led[id].skipped)
		}
	}
}

// TestStalenessFence: a replica that stopped hearing the config stream
// while another still hears it cannot fire; when no replica hears it (every
// one's last-heard stopped at about the same instant), all keep firing on
// the last known configuration (INV-staleness-fence).
func TestStalenessFence(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var ids []string
	for i := range 6 {
		id := fmt.Sprintf("s%d", i)
		ids = append(ids, id)
		e.put(every(id, "@every 1s"))
	}
	staleness := 2 * time.Second
	fast := func(c *scheduler.Config) { c.MaxStaleness = staleness }
	// The fence compares the freshness the replicas present with each
	// other, never with a clock, so their ticks come from a manual clock
	// (both replicas try every tick); the wall clock passes where the test
	// is about Redis TIME moving on.
	mt := newManualTime(t)
	a := mt.startNode(e, "a", nodeOpts{sched: fast})
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return a.counts().Fired >= 6 }, "a to fire")
	lost := time.Now().Add(-3 * staleness)
	b := mt.startNode(e, "b", nodeOpts{sched: fast, projection: func(p *projector.Projector) scheduler.Projection {
		return skewedProjection{Projector: p, heard: func() time.Time { return lost }}
	}})
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return b.counts().Refused["stale"] >= 3 }, "b's fires to be refused as stale")
	if n := b.counts().Fired; n != 0 {
		t.Errorf("b fired %d ticks with a stale projection", n)
	}
	b.stop()
	a.stop()

	// Nobody hears NATS: both replicas' last-heard froze at one instant.
	frozen := time.Now()
	freeze := func(p *projector.Projector) scheduler.Projection {
		return skewedProjection{Projector: p, heard: func() time.Time { return frozen }}
	}
	c := mt.startNode(e, "c", nodeOpts{sched: fast, projection: freeze})
	d := mt.startNode(e, "d", nodeOpts{sched: fast, projection: freeze})
	waitUntil(t, time.Now, frozen.Add(3*staleness))
	before := c.counts().Fired + d.counts().Fired
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return c.counts().Fired+d.counts().Fired >= before+12 }, "c and d to keep firing without NATS")
	for _, n := range []*node{c, d} {
		if r := n.counts().Refused["stale"]; r != 0 {
			t.Errorf("%s: %d fires refused as stale while nobody hears NATS", n.id, r)
		}
	}
	c.stop()
	d.stop()
	e.waitOutboxEmpty(5*time.Second, "default")
	led := ledgers(e.readActivity())
	for _, id := range ids {
		first, last := led[id].firedRange()
		checkEverySecond(t, id, led[id], first, last)
	}
}

// TestOutboxBackpressure: with the relay down the outbox grows past
// MaxOutboxBytes (its memory in Redis), firing pauses (Paused, nothing more fires); once a relay drains
// the outbox firing resumes and every tick is accounted for.
func TestOutboxBackpressure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var ids []string
	for i := range 10 {
		id := fmt.Sprintf("b%d", i)
		ids = append(ids, id)
		e.put(every(id, "@every 1s"))
	}
	backlog := func() int64 {
		n, err := e.store.OutboxBytes(context.Background(), testPrefix, "default")
		if err != nil {
			return 0
		}
		return n
	}
	mt := newManualTime(t)
	a := mt.startNode(e, "a", nodeOpts{noRelay: true, sched: func(c *scheduler.Config) {
		// A few dozen records.
		c.MaxOutboxBytes = 8 << 10
		c.OutboxBytes = backlog
	}})
	mt.until(20*time.Second, 250*time.Millisecond, a.sched.Paused, "firing to pause (backlog %d)", backlog())
	fired := a.counts().Fired
	mt.advance(2500 * time.Millisecond)
	if got := a.counts().Fired; got != fired || !a.sched.Paused() {
		t.Fatalf("fired %d more ticks while paused (paused %v)", got-fired, a.sched.Paused())
	}
	r, err := relay.New(relay.Config{Outbox: e.store, JS: e.js, Names: testNames, Owner: "late-relay", Interval: 50 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(testenv.Context(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	mt.until(20*time.Second, 250*time.Millisecond, func() bool { return !a.sched.Paused() && a.counts().Fired >= fired+20 }, "firing to resume")
	a.stop()
	if err := r.Stop(testenv.Context(t, 10*time.Second)); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	e.waitOutboxEmpty(5*time.Second, "default")
	led := ledgers(e.readActivity())
	for _, id := range ids {
		first, last := led[id].firedRange()
		checkEverySecond(t, id, led[id], first, last)
		for _, s := range led[id].skipped {
			if s.Reason != events.SkipMissed {
				t.Errorf("%s: skipped %+v", id, s)
			}
		}
	}
}
