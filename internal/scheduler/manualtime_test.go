package scheduler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testenv"
)

// manualTime is the time of a test where wall time is not the subject: the
// schedulers of its nodes run on one manual clock (clock.Manual) that the
// test moves on, so a minute of ticks comes due in moments and a test
// says exactly how much time passed instead of sleeping. Only the
// schedulers' time is manual: Redis TIME, the NATS servers' timestamps,
// and the relays, projectors and memberships stay on the wall clock. The
// nodes therefore run without shard ownership (ownsAll): its leases
// expire on Redis's clock and its view of NATS is stamped by the wall
// clock, neither of which a manual clock moves, so tests about ownership
// stay on the wall clock. So do tests whose assertions compare ticks with
// the config stream's timestamps (a pause or removal at a given instant):
// a manual clock that ran ahead puts those instants in the scheduler's
// past.
type manualTime struct {
	t     testing.TB
	m     *clock.Manual
	clock *scheduler.Clock

	mu    sync.Mutex
	nodes []*node // the nodes on the clock, until they stop
}

// newManualTime returns a manual clock reading the wall clock's now: the
// entries registered before it are on time, as they would be with the
// wall clock.
func newManualTime(t testing.TB) *manualTime {
	m := clock.NewManual(time.Now())
	return &manualTime{t: t, m: m, clock: clock.New(nil, clock.Options{Manual: m})}
}

// startNode starts a node whose scheduler runs on the manual clock,
// without shard ownership, and waits until it has acted on the instant
// the clock reads (its first load).
func (mt *manualTime) startNode(e *env, id string, o nodeOpts) *node {
	mt.t.Helper()
	o.clock, o.ownsAll = mt.clock, true
	n := e.startNode(id, o)
	mt.mu.Lock()
	mt.nodes = append(mt.nodes, n)
	mt.mu.Unlock()
	mt.settle()
	return n
}

// now reads the manual clock.
func (mt *manualTime) now() time.Time { return mt.m.Now() }

// settle waits until every running scheduler has acted on the instant the
// clock reads: each timer that fired was taken (its owner armed it again)
// and each firing loop finished its turn and waits for its next event.
// A fire pass returns only when its fires did, so the scheduler's counts
// and what it wrote to Redis are then final for the instant; what the
// relays publish follows on the wall clock.
func (mt *manualTime) settle() {
	mt.t.Helper()
	idle := func(ctx context.Context) error {
		for _, n := range mt.running() {
			if err := n.sched.WaitIdle(ctx); err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("%s: %w", n.id, err)
				}
				mt.forget(n) // stopped: its loop has returned
			}
		}
		return nil
	}
	testenv.Settle(mt.t, 30*time.Second, func() bool { return mt.m.Outstanding() == 0 }, idle, func() string {
		return fmt.Sprintf("manual clock at %s (timers not taken: %d)", mt.now().Format(time.TimeOnly), mt.m.Outstanding())
	})
}

func (mt *manualTime) running() []*node {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	return append([]*node(nil), mt.nodes...)
}

func (mt *manualTime) forget(n *node) {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	for i, m := range mt.nodes {
		if m == n {
			mt.nodes = append(mt.nodes[:i], mt.nodes[i+1:]...)
			return
		}
	}
}

// advance moves the clock d on, stopping at every timer's deadline on the
// way and letting the schedulers settle at each, as the wall clock would
// have woken them.
func (mt *manualTime) advance(d time.Duration) {
	mt.t.Helper()
	end := mt.now().Add(d)
	for {
		mt.settle()
		next, ok := mt.m.Next()
		if !ok || next.After(end) {
			mt.m.AdvanceTo(end)
			mt.settle()
			return
		}
		mt.m.AdvanceTo(next)
	}
}

// until moves the clock on a step at a time until cond holds, failing
// when it has not after timeout of wall time. Between steps cond gets a
// moment of wall time, for what follows on the wall clock (a relay
// publishing, a projection catching up), so the manual clock does not
// race far ahead of it.
func (mt *manualTime) until(timeout, step time.Duration, cond func() bool, format string, args ...any) {
	mt.t.Helper()
	deadline := time.Now().Add(timeout)
	for !testenv.WaitFor(10*time.Millisecond, cond) {
		if time.Now().After(deadline) {
			mt.t.Fatalf("manual clock at %s: condition not met within %s of wall time: "+format,
				append([]any{mt.now().Format(time.TimeOnly), timeout}, args...)...)
		}
		mt.advance(step)
	}
}
