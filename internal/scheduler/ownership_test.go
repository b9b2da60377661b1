package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
)

// The tests of shard ownership with real schedulers: several replicas,
// several queues, entries changing; each checks that every tick is handled
// exactly once (fired, or recorded as skipped by its policy) whatever
// happens to the owners.

// ownedEntries registers perQueue entries firing every second in each of
// queues, with catch-up all (a tick a replica fires late is still fired),
// and returns their ids and queues.
func (e *env) ownedEntries(queues []string, perQueue int) (ids []string, queueOf map[string]string) {
	e.t.Helper()
	queueOf = map[string]string{}
	for _, q := range queues {
		for i := range perQueue {
			id := fmt.Sprintf("%s-%02d", q, i)
			ids = append(ids, id)
			queueOf[id] = q
			e.put(every(id, "@every 1s", inQueue(q), withCatchup(events.CatchupAll, time.Hour)))
		}
	}
	return ids, queueOf
}

// settledOwners waits until every shard of queues has an owner among
// nodes, each shard one, as the nodes' own owned sets say.
func settledOwners(t *testing.T, queues []string, timeout time.Duration, nodes ...*node) {
	t.Helper()
	testenv.Eventually(t, timeout, func() bool {
		owner := map[events.Shard]string{}
		for _, n := range nodes {
			for s := range n.own.Owned().Until {
				if _, dup := owner[s]; dup {
					return false
				}
				owner[s] = n.id
			}
		}
		return len(owner) == len(queues)*events.ShardsPerQueue
	}, "every shard of %v owned by one of the replicas", queues)
}

// leaseHolder returns the replica whose lease on shard Redis holds ("" when
// none does).
func (e *env) leaseHolder(shard events.Shard) string {
	e.t.Helper()
	v, err := e.store.ShardLeases(testenv.Context(e.t, 5*time.Second), testNames.Prefix(), []string{shard.Queue}, false)
	if err != nil {
		e.t.Fatalf("read the shard leases: %v", err)
	}
	for _, l := range v.Leases {
		if l.Shard == shard {
			return l.Holder
		}
	}
	return ""
}

// checkOnceFrom asserts that each of ids fired every tick from from to
// the last one it fired, each once, and that no tick was recorded as
// missed; it returns the ledgers.
func (e *env) checkOnceFrom(ids []string, from time.Time) map[string]*ledger {
	e.t.Helper()
	led := ledgers(e.readActivity())
	for _, id := range ids {
		l := led[id]
		if l == nil {
			e.t.Errorf("entry %s never fired", id)
			continue
		}
		_, last := l.firedRange()
		checkEverySecond(e.t, id, l, from.Unix(), last)
		for _, s := range l.skipped {
			if s.Reason == events.SkipMissed && !s.ScheduledAt.Before(from) {
				e.t.Errorf("entry %s: ticks recorded as missed %+v", id, s)
			}
		}
	}
	return led
}

// firedBy returns, per entry, the replicas that fired its ticks scheduled
// in [from, to].
func firedBy(acts []activity, from, to time.Time) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, a := range acts {
		if a.Type != events.TypeEntryFired || a.Fired.ScheduledAt.Before(from) || a.Fired.ScheduledAt.After(to) {
			continue
		}
		if out[a.Fired.Entry] == nil {
			out[a.Fired.Entry] = map[string]int{}
		}
		out[a.Fired.Entry][a.Fired.Replica]++
	}
	return out
}

// TestOwnedShardsFireEveryTickOnce: three replicas own the shards of three
// queues; while they fire 24 entries every second, one entry is edited,
// one moves to another queue, one is paused and resumed, one removed and
// one registered. Every tick is handled once; in steady state each entry is
// fired by one replica alone (the owner of its shard), nobody tries a tick
// another fired (no watermark refusals), and the shards are shared out.
func TestOwnedShardsFireEveryTickOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa", "qb", "qc"}
	ids, _ := e.ownedEntries(queues, 8)
	nodes := []*node{e.startNode("r1", nodeOpts{}), e.startNode("r2", nodeOpts{}), e.startNode("r3", nodeOpts{})}
	settledOwners(t, queues, 20*time.Second, nodes...)
	// The handovers of the start are over once each owns its share.
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, n := range nodes {
			if r := n.own.Report(); r.Owned != r.Desired || r.Owned == 0 {
				return false
			}
		}
		return true
	}, "each replica to own its share")
	refusedBefore := sumRefused(nodes)
	steady := time.Now().Truncate(time.Second).Add(2 * time.Second)

	e.put(every("qa-00", "@every 1s", inQueue("qa"), withCatchup(events.CatchupAll, time.Hour), func(en *events.Entry) { en.Task.Payload = []byte(`"edited"`) }))
	e.put(every("qa-01", "@every 1s", inQueue("qb"), withCatchup(events.CatchupAll, time.Hour)))
	paused := e.pauseOf("qb-00", "")
	e.removeOf("qb-01")
	e.put(every("late", "@every 1s", inQueue("qc")))
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	resumed := e.resume("qb-00")
	waitUntil(t, time.Now, time.Now().Add(6*time.Second))
	end := time.Now().Add(-2 * time.Second).Truncate(time.Second)
	refused := sumRefused(nodes) - refusedBefore
	for _, n := range nodes {
		n.stop()
	}
	e.waitOutboxEmpty(10*time.Second, queues...)

	var stable []string
	for _, id := range ids {
		if !slices.Contains([]string{"qb-00", "qb-01"}, id) {
			stable = append(stable, id)
		}
	}
	led := e.checkOnceFrom(stable, steady)
	by := firedBy(e.readActivity(), steady, end)
	for _, id := range stable {
		if len(by[id]) != 1 {
			t.Errorf("entry %s fired by %v in steady state, want one replica", id, by[id])
		}
	}
	if refused != 0 {
		t.Errorf("%d fire attempts refused on the watermark in steady state: replicas tried ticks others had fired", refused)
	}
	// The pause takes effect when the owner applies it, a projection's
	// delay after the stream stored it: a tick due in that second may fire.
	for s := range led["qb-00"].fired {
		if s > paused.Unix()+1 && s <= resumed.Unix() {
			t.Errorf("qb-00 fired %s while paused", fmtUnix(s))
		}
	}
	for _, n := range nodes {
		if r := n.own.Report(); r.Owned == 0 {
			t.Errorf("%s owned no shard: %+v", n.id, r)
		}
	}
}

func sumRefused(nodes []*node) uint64 {
	var n uint64
	for _, nd := range nodes {
		n += nd.counts().Refused["watermark-mismatch"]
	}
	return n
}

// TestOwnerKilledTakenOverInGrace: the owner of a third of the shards is
// killed (nothing released, its heartbeat left to expire): the others take
// its shards over within the catch-up grace, so its entries' ticks fire
// late but once, none recorded as missed.
func TestOwnerKilledTakenOverInGrace(t *testing.T) {
	t.Parallel()
	t.Run("no history", func(t *testing.T) {
		t.Parallel()
		ownerKilledTakenOverInGrace(t, nil)
	})
	// The replicas check a taken-over watermark against the activity
	// stream, whose reads hang from the kill on (JetStream back without a
	// leader after a restart answers nothing): the check may not hold the
	// takeover's ticks past the grace.
	t.Run("stream reads hang", func(t *testing.T) {
		t.Parallel()
		ownerKilledTakenOverInGrace(t, &hangingReads{})
	})
}

// hangingReads is a History whose reads of the entries' last fires hang
// until their context ends once hang is set.
type hangingReads struct {
	scheduler.History
	hang atomic.Bool
}

func (h *hangingReads) LastHandledAll(ctx context.Context) (map[string]time.Time, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.History.LastHandledAll(ctx)
}

func (h *hangingReads) LastHandled(ctx context.Context, entry string) (time.Time, string, bool, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return time.Time{}, "", false, ctx.Err()
	}
	return h.History.LastHandled(ctx, entry)
}

func ownerKilledTakenOverInGrace(t *testing.T, reads *hangingReads) {
	e := newEnv(t)
	queues := []string{"qa", "qb"}
	ids, _ := e.ownedEntries(queues, 10)
	o := nodeOpts{noHistory: reads == nil}
	if reads != nil {
		reads.History = scheduler.NewStreamHistory(e.js, testNames)
		o.sched = func(cfg *scheduler.Config) { cfg.History = reads }
	}
	nodes := []*node{e.startNode("r1", o), e.startNode("r2", o), e.startNode("r3", o)}
	settledOwners(t, queues, 20*time.Second, nodes...)
	// Each holds its share, so the killed one dies holding shards (before
	// the handovers it would die holding all, after a release none).
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, n := range nodes {
			if r := n.own.Report(); r.Owned == 0 || r.Owned != r.Desired {
				return false
			}
		}
		return true
	}, "every replica to hold its share")
	waitUntil(t, time.Now, time.Now().Add(2*time.Second))
	from := time.Now().Truncate(time.Second)
	held := nodes[0].own.Report().Owned
	killed := time.Now()
	if reads != nil {
		reads.hang.Store(true)
	}
	nodes[0].crash()
	waitUntil(t, time.Now, killed.Add(12*time.Second))
	nodes[1].stop()
	nodes[2].stop()
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceFrom(ids, from)
	var late time.Duration
	for _, a := range e.readActivity() {
		if a.Type == events.TypeEntryFired && a.Fired.ScheduledAt.After(killed) {
			late = max(late, a.Fired.EnqueuedAt.Sub(a.Fired.ScheduledAt))
		}
	}
	if late >= scheduler.DefaultGrace {
		t.Errorf("a tick after the kill fired %s late, beyond the grace %s", late, scheduler.DefaultGrace)
	}
	if n := nodes[1].own.Report().Takeovers + nodes[2].own.Report().Takeovers; n == 0 {
		t.Errorf("no takeover counted (the killed replica held %d shards; handed in: %d, %d)", held, nodes[1].own.Report().HandoversIn, nodes[2].own.Report().HandoversIn)
	}
	t.Logf("latest fire after the kill: %s", late)
}

// TestHandoverOnJoinAndLeave: a replica joins two that own every shard,
// and later one leaves cleanly: shards move to their desired owners
// (counted as handovers on both sides), and no tick is missed or fired
// twice across the moves.
func TestHandoverOnJoinAndLeave(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa", "qb"}
	ids, _ := e.ownedEntries(queues, 10)
	a, b := e.startNode("a", nodeOpts{}), e.startNode("b", nodeOpts{})
	settledOwners(t, queues, 20*time.Second, a, b)
	waitUntil(t, time.Now, time.Now().Add(2*time.Second))
	from := time.Now().Truncate(time.Second)
	c := e.startNode("c", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { r := c.own.Report(); return r.Owned > 0 && r.Owned == r.Desired }, "c to be handed its share")
	settledOwners(t, queues, 20*time.Second, a, b, c)
	a.stop()
	settledOwners(t, queues, 20*time.Second, b, c)
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	b.stop()
	c.stop()
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceFrom(ids, from)
	var in, out uint64
	for _, n := range []*node{a, b, c} {
		r := n.own.Report()
		in, out = in+r.HandoversIn, out+r.HandoversOut
	}
	if c.own.Report().HandoversIn == 0 || out == 0 {
		t.Errorf("handovers: c took %d in, %d out in all, %d in in all", c.own.Report().HandoversIn, out, in)
	}
}

// filteredMembers is a membership view without some replicas (a split
// view).
type filteredMembers struct {
	m    *replica.Membership
	hide func(id string) bool
}

func (f filteredMembers) Candidates() []string {
	return slices.DeleteFunc(f.m.Candidates(), f.hide)
}

func (f filteredMembers) Live() []string { return slices.DeleteFunc(f.m.Live(), f.hide) }

// TestSplitViewsFireOnce: three replicas, a and c each blind to the other
// (b sees both): they disagree on many shards' desired owners, and may
// hand shards back and forth, yet every tick fires once.
func TestSplitViewsFireOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa", "qb"}
	ids, _ := e.ownedEntries(queues, 10)
	blind := func(other string) nodeOpts {
		return nodeOpts{members: func(m *replica.Membership) ownership.Members {
			return filteredMembers{m: m, hide: func(id string) bool { return id == other }}
		}}
	}
	a, b, c := e.startNode("a", blind("c")), e.startNode("b", nodeOpts{}), e.startNode("c", blind("a"))
	testenv.Eventually(t, 20*time.Second, func() bool { return sumStats(a, b, c).Fired >= uint64(3*len(ids)) }, "the entries to fire")
	from := time.Now().Truncate(time.Second)
	waitUntil(t, time.Now, from.Add(15*time.Second))
	for _, n := range []*node{a, b, c} {
		n.stop()
	}
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceFrom(ids, from)
}

// flappingMembers adds a replica that is there for two seconds and gone
// for two, in every view at once (a membership that flaps); it never
// takes a shard.
type flappingMembers struct{ m *replica.Membership }

func (f flappingMembers) Candidates() []string {
	c := f.m.Candidates()
	if time.Now().Unix()%4 < 2 {
		c = append(c, "ghost")
		slices.Sort(c)
	}
	return c
}

func (f flappingMembers) Live() []string { return f.m.Live() }

// TestFlappingMembership: a replica comes and goes every two seconds in
// every view, never taking the shards it is given: the shards it should
// own wait for the takeover by rank, and move back and forth; every tick
// still fires once, none missed.
func TestFlappingMembership(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa", "qb"}
	ids, _ := e.ownedEntries(queues, 10)
	flap := nodeOpts{members: func(m *replica.Membership) ownership.Members { return flappingMembers{m} }}
	a, b := e.startNode("a", flap), e.startNode("b", flap)
	testenv.Eventually(t, 20*time.Second, func() bool { return sumStats(a, b).Fired >= uint64(3*len(ids)) }, "the entries to fire")
	from := time.Now().Truncate(time.Second)
	waitUntil(t, time.Now, from.Add(16*time.Second))
	a.stop()
	b.stop()
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceFrom(ids, from)
}

// TestOwnerCutOffFromNATS: the owner of some shards is cut off from NATS
// (its connection goes through a proxy that stops forwarding) but not
// from Redis, while the others hear NATS: it stops renewing, its shards
// are taken over, and every tick fires once; healed, it takes its share
// back.
func TestOwnerCutOffFromNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa", "qb"}
	ids, _ := e.ownedEntries(queues, 10)
	proxy := testenv.StartProxy(t, strings.TrimPrefix(e.nats.URL(), "nats://"))
	a, b := e.startNode("a", nodeOpts{}), e.startNode("b", nodeOpts{})
	c := e.startNode("c", nodeOpts{natsURL: "nats://" + proxy.Addr()})
	settledOwners(t, queues, 20*time.Second, a, b, c)
	testenv.Eventually(t, 20*time.Second, func() bool { r := c.own.Report(); return r.Owned > 0 && r.Owned == r.Desired }, "c to own its share")
	testenv.Eventually(t, 20*time.Second, func() bool { return sumStats(a, b, c).Fired >= uint64(2*len(ids)) }, "the entries to fire")
	from := time.Now().Truncate(time.Second)
	proxy.Cut(testenv.Blackhole)
	testenv.Eventually(t, 20*time.Second, func() bool { return len(c.own.Owned().Until) == 0 }, "c, cut off, to let its shards go")
	settledOwners(t, queues, 20*time.Second, a, b)
	if c.own.Report().Problem == "" {
		t.Error("c's report names no problem while it is cut off")
	}
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	proxy.Heal()
	testenv.Eventually(t, 30*time.Second, func() bool { r := c.own.Report(); return r.Owned > 0 && r.Owned == r.Desired }, "c to take its share back")
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	for _, n := range []*node{a, b, c} {
		n.stop()
	}
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceFrom(ids, from)
}

// freezer blocks every Redis command of a node while frozen: with its
// heartbeats blocked too, the node is as a process stopped by SIGSTOP is
// to the others, and what it had sent before goes on after it thaws.
type freezer struct {
	mu   sync.Mutex
	thaw chan struct{} // nil: not frozen
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.thaw = make(chan struct{})
}

func (f *freezer) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw != nil {
		close(f.thaw)
		f.thaw = nil
	}
}

// wait returns once the node is not frozen.
func (f *freezer) wait() {
	f.mu.Lock()
	thaw := f.thaw
	f.mu.Unlock()
	if thaw != nil {
		<-thaw
	}
}

func (f *freezer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *freezer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { f.wait(); return next(ctx, cmd) }
}

func (f *freezer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { f.wait(); return next(ctx, cmds) }
}

// TestFrozenOwner: an owner frozen for 8 s (its Redis commands and
// heartbeats held) loses its shards to the others, which fire its entries
// late but once; when it thaws, the commands it had started complete, and
// it fires nothing of the shards it lost (its leases are past their term
// by its own clock) before it takes its share back.
func TestFrozenOwner(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa", "qb"}
	ids, _ := e.ownedEntries(queues, 10)
	f := &freezer{}
	rc := e.redis.Client(t)
	rc.AddHook(f)
	a, b := e.startNode("a", nodeOpts{}), e.startNode("b", nodeOpts{})
	c := e.startNode("c", nodeOpts{rc: rc, beat: f.wait})
	t.Cleanup(f.unfreeze) // before c stops, should the test end frozen
	settledOwners(t, queues, 20*time.Second, a, b, c)
	testenv.Eventually(t, 20*time.Second, func() bool { r := c.own.Report(); return r.Owned > 0 && r.Owned == r.Desired }, "c to own its share")
	testenv.Eventually(t, 20*time.Second, func() bool { return sumStats(a, b, c).Fired >= uint64(2*len(ids)) }, "the entries to fire")
	from := time.Now().Truncate(time.Second)
	f.freeze()
	frozen := time.Now()
	settledOwners(t, queues, 20*time.Second, a, b)
	waitUntil(t, time.Now, frozen.Add(8*time.Second))
	thawed := time.Now()
	f.unfreeze()
	testenv.Eventually(t, 30*time.Second, func() bool { r := c.own.Report(); return r.Owned > 0 && r.Owned == r.Desired }, "c to take its share back")
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	for _, n := range []*node{a, b, c} {
		n.stop()
	}
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceFrom(ids, from)
	for _, a := range e.readActivity() {
		if a.Type == events.TypeEntryFired && a.Fired.Replica == "c" && a.Fired.EnqueuedAt.After(frozen.Add(time.Second)) && a.Fired.EnqueuedAt.Before(thawed) {
			t.Errorf("c fired %s tick %s at %s while frozen", a.Fired.Entry, a.Fired.ScheduledAt.Format(time.TimeOnly), a.Fired.EnqueuedAt.Format(time.TimeOnly))
		}
	}
}

// TestNATSOutageOwnerKilled: every NATS server goes down, and one owner is
// killed during the outage: the others (whose views shrink to themselves
// as heartbeats stop) take its shards over from Redis alone, and every
// tick fires once; after NATS is back every event reaches the stream.
func TestNATSOutageOwnerKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa", "qb"}
	ids, _ := e.ownedEntries(queues, 10)
	a, b, c := e.startNode("a", nodeOpts{}), e.startNode("b", nodeOpts{}), e.startNode("c", nodeOpts{})
	settledOwners(t, queues, 20*time.Second, a, b, c)
	waitUntil(t, time.Now, time.Now().Add(2*time.Second))
	from := time.Now().Truncate(time.Second)
	e.nats.Shutdown()
	waitUntil(t, time.Now, time.Now().Add(5*time.Second))
	c.crash()
	settledOwners(t, queues, 20*time.Second, a, b)
	waitUntil(t, time.Now, time.Now().Add(5*time.Second))
	e.nats.Restart(t)
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	a.stop()
	b.stop()
	e.waitOutboxEmpty(30*time.Second, queues...)
	e.checkOnceFrom(ids, from)
}

// slowRedis delays every pipeline of a client (a fire batch is one): a
// replica whose Redis calls are slow has less capacity than its schedule
// asks for.
type slowRedis struct{ delay time.Duration }

func (s slowRedis) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (s slowRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (s slowRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(s.delay)
		return next(ctx, cmds)
	}
}

// TestFairAcrossQueues: one queue's flood (1,500 entries every second)
// beside a small queue (5 entries) on a replica that can fire about 1,000
// a second (batches of 50, one at a time, each call 50 ms): the pass
// shares its capacity round-robin between the queues, so the small
// queue's entries fire every tick, once, while the flood falls behind.
func TestFairAcrossQueues(t *testing.T) {
	// Not parallel: it measures what a replica fires against a fixed
	// capacity, which the package's other tests would take CPU from.
	e := newEnv(t)
	eventtest.Register(t, e.js, testNames, "test", entriesOf(1500, func(i int) events.Entry {
		return every(fmt.Sprintf("flood-%04d", i), "@every 1s", inQueue("flood"))
	}), 30*time.Second)
	var small []string
	for i := range 5 {
		id := fmt.Sprintf("small-%d", i)
		small = append(small, id)
		e.put(every(id, "@every 1s", inQueue("small")))
	}
	rc := e.redis.Client(t)
	rc.AddHook(slowRedis{50 * time.Millisecond})
	// The flood falls about half a second further behind every second: a
	// grace of 2 s (not the default 5) makes its ticks missed well within
	// the test's seconds, however fast the replica got its entries loaded.
	n := e.startNode("a", nodeOpts{rc: rc, sched: func(c *scheduler.Config) { c.Batch, c.Parallel, c.Grace = 50, 1, 2*time.Second }})
	testenv.Eventually(t, 60*time.Second, func() bool { return n.counts().Loading == 0 && n.counts().Entries == 1505 }, "the entries to load")
	from := time.Now().Truncate(time.Second).Add(3 * time.Second)
	// The flood's backlog never drains from then on, so the scheduler is
	// busy all along (Busy, which a relay waits for), also between turns.
	waitUntil(t, time.Now, from)
	samples, idle := 0, 0
	for time.Now().Before(from.Add(6 * time.Second)) {
		samples++
		if !n.sched.Busy() {
			idle++
		}
		time.Sleep(time.Millisecond)
	}
	waitUntil(t, time.Now, from.Add(8*time.Second))
	n.stop()
	if idle > 0 {
		t.Errorf("Busy was false in %d of %d samples while the flood was behind", idle, samples)
	}
	e.waitOutboxEmpty(60*time.Second, "small")
	led := ledgers(e.readActivity())
	for _, id := range small {
		l := led[id]
		if l == nil {
			t.Fatalf("%s never fired", id)
		}
		checkEverySecond(t, id, l, from.Unix(), from.Add(6*time.Second).Unix())
		for _, s := range l.skipped {
			if !s.ScheduledAt.Before(from) {
				t.Errorf("%s: ticks skipped %+v", id, s)
			}
		}
	}
	if st := n.counts(); st.SkippedMissed == 0 {
		t.Errorf("the flood never fell behind (no missed ticks recorded): the test did not overload the replica (%+v)", st)
	}
}

// TestFencedOwnerLetsGo: an owner whose projection lags the config stream
// (its fires refused by the revision fence, every one) counts itself not
// ready once that lasted ownership.FencedFor: its shards go to the
// replicas that fire them, and every tick fires once, late at most by the
// grace.
func TestFencedOwnerLetsGo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	queues := []string{"qa"}
	ids, _ := e.ownedEntries(queues, 12)
	old := e.put(every("bump", "@every 1h", inQueue("qa"))) - 1
	a, b := e.startNode("a", nodeOpts{}), e.startNode("b", nodeOpts{})
	settledOwners(t, queues, 20*time.Second, a, b)
	testenv.Eventually(t, 20*time.Second, func() bool { return sumStats(a, b).Fired >= uint64(2*len(ids)) }, "the entries to fire")
	lag := e.startNode("lag", nodeOpts{projection: func(p *projector.Projector) scheduler.Projection {
		return skewedProjection{Projector: p, seq: func() uint64 { return old }}
	}})
	from := time.Now().Truncate(time.Second)
	testenv.Eventually(t, 20*time.Second, func() bool { return lag.counts().Refused["revision-fenced"] > 0 }, "lag to own shards and be fenced")
	testenv.Eventually(t, 20*time.Second, func() bool { return lag.sched.Fenced() >= ownership.FencedFor && len(lag.own.Owned().Until) == 0 }, "lag to let its shards go")
	settledOwners(t, queues, 20*time.Second, a, b)
	waitUntil(t, time.Now, time.Now().Add(4*time.Second))
	for _, n := range []*node{a, b, lag} {
		n.stop()
	}
	e.waitOutboxEmpty(10*time.Second, queues...)
	e.checkOnceFrom(ids, from)
}
