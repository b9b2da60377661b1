package scalesim

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
)

// The membership the simulated replicas see, as the replicas bucket gives
// it: a replica beats every heartbeat from its start and stays in the
// others' views until memberTTL after its last beat; one stopped cleanly
// removes its heartbeat at once.
const (
	heartbeat = 2 * time.Second
	memberTTL = 3 * heartbeat
)

// cluster is the simulated deployment: the replicas, the manual clock
// they run on, the projection and Redis they share.
type cluster struct {
	tb    testing.TB
	clock *clock.Manual
	redis *fakeRedis
	proj  *projector.Projector
	names events.Names
	log   *slog.Logger

	mu       sync.Mutex
	replicas []*replica // every replica started, in order
	// share is each replica's fair part of the work done so far (work
	// done while it was up, divided among the replicas up then), by
	// kind of work.
	share map[string]*work
	// last is the work counted at the last step.
	last work
	// from is when the measures began (the end of the cold start), and
	// base each replica's work then.
	from time.Time
	base map[string]work
}

// work is the simulation's measures of a replica's work.
type work struct{ attempts, reads, heapOps float64 }

// replica is one simulated replica: the real ownership manager and
// scheduler on a connection to the fake Redis.
type replica struct {
	id     string
	c      *cluster
	broker *broker
	own    *ownership.Manager
	shards *turns
	sched  *scheduler.Scheduler
	// started and stopped are simulated times (stopped zero while up);
	// killed says it stopped without releasing anything.
	started, stopped time.Time
	killed           bool
	ready            atomic.Bool
}

// turns is the ownership manager as the scheduler sees it, recording the
// version of the owned set the loop last turned with.
type turns struct {
	*ownership.Manager
	turned atomic.Uint64
}

func (t *turns) Turned(v uint64) {
	t.turned.Store(v)
	t.Manager.Turned(v)
}

// members is one replica's view of the membership.
type members struct {
	c    *cluster
	self *replica
}

func (m members) Candidates() []string { return m.c.view(m.self, true) }
func (m members) Live() []string       { return m.c.view(m.self, false) }

// view is what self sees of the replicas now.
func (c *cluster) view(self *replica, candidates bool) []string {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, r := range c.replicas {
		switch {
		case r == self:
		case r.stopped.IsZero():
		case !r.killed:
			continue // its heartbeat was removed
		case now.Sub(r.lastBeat()) > memberTTL:
			continue
		}
		if !candidates || r.ready.Load() {
			ids = append(ids, r.id)
		}
	}
	slices.Sort(ids)
	return ids
}

// lastBeat is when a killed replica beat last.
func (r *replica) lastBeat() time.Time {
	up := r.stopped.Sub(r.started)
	return r.started.Add(up - up%heartbeat)
}

func (r *replica) up() bool { return r.stopped.IsZero() }

// start starts a replica as cronstream run does: the scheduler once the
// projection is caught up, then ownership.
func (c *cluster) start(id string) *replica {
	c.tb.Helper()
	clk := clock.New(nil, clock.Options{Manual: c.clock})
	r := &replica{id: id, c: c, broker: &broker{r: c.redis, id: id}, started: c.clock.Now()}
	log := c.log.With("replica", id)
	own, err := ownership.New(ownership.Config{
		Store: r.broker, Members: members{c, r}, Names: c.names, ReplicaID: id,
		Queues: c.proj.Queues, HeardNATS: clk.Now, Clock: clk, MemberTTL: memberTTL, Logger: log,
	})
	if err != nil {
		c.tb.Fatal(err)
	}
	r.own, r.shards = own, &turns{Manager: own}
	if r.sched, err = scheduler.New(scheduler.Config{
		Broker: r.broker, Projection: c.proj, Shards: r.shards, Names: c.names,
		ReplicaID: id, Clock: clk, Logger: log,
	}); err != nil {
		c.tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.sched.Start(ctx); err != nil {
		c.tb.Fatal(err)
	}
	r.ready.Store(true)
	c.mu.Lock()
	c.replicas = append(c.replicas, r)
	if c.share[id] == nil {
		c.share[id] = &work{}
	}
	c.mu.Unlock()
	if err := own.Start(ctx); err != nil {
		c.tb.Fatal(err)
	}
	c.tb.Cleanup(func() { r.halt(false) })
	return r
}

// kill stops r as kill -9 does: its connection to Redis is gone at once,
// nothing is released, and its heartbeat ages out of the others' views.
func (c *cluster) kill(r *replica) {
	r.broker.dead.Store(true)
	c.mu.Lock()
	r.stopped, r.killed = c.clock.Now(), true
	c.mu.Unlock()
	r.halt(true)
}

// stop stops r as SIGTERM does: firing stops, its leases are released and
// its heartbeat removed.
func (c *cluster) stop(r *replica) {
	r.halt(false)
	c.mu.Lock()
	r.stopped = c.clock.Now()
	c.mu.Unlock()
}

func (r *replica) halt(dead bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if dead {
		cancel() // nothing is released
	}
	_ = r.sched.Stop(ctx)
	_ = r.own.Stop(ctx)
}

// upReplicas returns the replicas up now.
func (c *cluster) upReplicas() []*replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*replica
	for _, r := range c.replicas {
		if r.up() {
			out = append(out, r)
		}
	}
	return out
}

// settle waits until every replica has acted on the instant the clock
// reads: every timer that fired was taken (its owner armed it again), each
// scheduler holds the owned set its ownership published, and each firing
// loop waits for its next event.
func (c *cluster) settle() {
	c.tb.Helper()
	idle := func(ctx context.Context) error {
		for _, r := range c.upReplicas() {
			if err := r.sched.WaitIdle(ctx); err != nil {
				return fmt.Errorf("%s: %w", r.id, err)
			}
		}
		return nil
	}
	testenv.Settle(c.tb, 5*time.Minute, c.quiet, idle, func() string {
		return fmt.Sprintf("simulation at %s (timers not taken: %d)", c.clock.Now().Format(time.RFC3339Nano), c.clock.Outstanding())
	})
}

// quiet reports whether no timer waits for its owner and every scheduler
// holds its ownership's owned set.
func (c *cluster) quiet() bool {
	if c.clock.Outstanding() > 0 {
		return false
	}
	for _, r := range c.upReplicas() {
		if r.own.Owned().Version != r.shards.turned.Load() {
			return false
		}
	}
	return true
}

// runUntil moves the clock to end, stopping at every timer's deadline and
// letting the replicas settle at each.
func (c *cluster) runUntil(end time.Time) {
	c.tb.Helper()
	for {
		c.settle()
		c.account()
		next, ok := c.clock.Next()
		if !ok || next.After(end) {
			c.clock.AdvanceTo(end)
			c.settle()
			c.account()
			return
		}
		c.clock.AdvanceTo(next)
	}
}

// measure is the work r has done since the measures began.
func (c *cluster) measure(r *replica) work {
	b := c.base[r.id]
	return work{attempts: float64(r.broker.attempts.Load()) - b.attempts, reads: float64(r.broker.reads.Load()) - b.reads,
		heapOps: float64(r.sched.HeapOps()) - b.heapOps}
}

// measureAll is every replica's work so far.
func (c *cluster) measureAll() map[string]work {
	c.mu.Lock()
	all := slices.Clone(c.replicas)
	c.mu.Unlock()
	out := map[string]work{}
	for _, r := range all {
		out[r.id] = c.measure(r)
	}
	return out
}

// beginMeasures makes the measures count from now: the cold start, where
// the first replica up takes every shard until the others are, is over.
func (c *cluster) beginMeasures() {
	c.mu.Lock()
	c.from = c.clock.Now()
	for _, s := range c.share {
		*s = work{}
	}
	c.last = work{}
	c.mu.Unlock()
	c.base = nil
	c.base = c.measureAll()
}

// account shares the work done since the last step out among the
// replicas up: each one's fair part.
func (c *cluster) account() {
	var total work
	c.mu.Lock()
	all := slices.Clone(c.replicas)
	c.mu.Unlock()
	var up []*replica
	for _, r := range all {
		w := c.measure(r)
		total.attempts += w.attempts
		total.reads += w.reads
		total.heapOps += w.heapOps
		if r.up() {
			up = append(up, r)
		}
	}
	d := work{total.attempts - c.last.attempts, total.reads - c.last.reads, total.heapOps - c.last.heapOps}
	c.last = total
	if len(up) == 0 {
		return
	}
	n := float64(len(up))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range up {
		s := c.share[r.id]
		s.attempts += d.attempts / n
		s.reads += d.reads / n
		s.heapOps += d.heapOps / n
	}
}

// holders counts the shards each up replica holds a lease of now.
func (c *cluster) holders() map[string]int {
	out := map[string]int{}
	for _, r := range c.upReplicas() {
		out[r.id] = 0
	}
	for _, q := range c.proj.Queues() {
		for i := range events.ShardsPerQueue {
			if h := c.redis.holder(events.Shard{Queue: q, Index: i}); h != "" {
				out[h]++
			}
		}
	}
	return out
}

func (c *cluster) String() string {
	var ids []string
	for _, r := range c.upReplicas() {
		ids = append(ids, r.id)
	}
	return fmt.Sprintf("%d replicas up %v at %s", len(ids), ids, c.clock.Now().Format("15:04:05.000"))
}
