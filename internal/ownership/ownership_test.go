package ownership

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.LeakOptions()...) }

var testNames = events.MustNames("own")

// view is a membership as a test sets it, per replica (split views).
type view struct {
	mu    sync.Mutex
	cands []string
}

func (v *view) set(ids ...string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.cands = slices.Sorted(slices.Values(ids))
}

func (v *view) Candidates() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.cands)
}

func (v *view) Live() []string { return v.Candidates() }

// replica is a manager with a loop that turns like a scheduler's (it
// acknowledges every owned set), which the test can freeze.
type replica struct {
	id     string
	rc     *redis.Client
	m      *Manager
	view   *view
	heard  func() time.Time
	frozen sync.Mutex // held: the "firing loop" does not turn
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

type fleet struct {
	t      *testing.T
	redis  *testenv.Redis
	store  *taskstate.Store
	queues []string
}

func newFleet(t *testing.T, queues ...string) *fleet {
	r := testenv.StartRedis(t)
	return &fleet{t: t, redis: r, store: taskstate.New(r.Client(t)), queues: queues}
}

// start runs replica id, seeing candidates v, with cfg's timings.
func (f *fleet) start(id string, v *view, tune func(*Config)) *replica {
	f.t.Helper()
	r := &replica{id: id, rc: f.redis.Client(f.t), view: v, stop: make(chan struct{})}
	cfg := Config{Store: taskstate.New(r.rc), Members: v, Names: testNames, ReplicaID: id,
		Queues: func() []string { return f.queues }, Logger: testLogger(f.t, id)}
	if tune != nil {
		tune(&cfg)
	}
	var err error
	if r.m, err = New(cfg); err != nil {
		f.t.Fatal(err)
	}
	if err := r.m.Start(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
				r.frozen.Lock()
				r.m.Turned(r.m.Owned().Version)
				r.frozen.Unlock()
			}
		}
	}()
	f.t.Cleanup(func() { r.shutdown(true) })
	return r
}

// shutdown stops the replica; release says whether it releases its
// leases (a clean stop) or leaves them to lapse (a kill).
func (r *replica) shutdown(release bool) {
	r.once.Do(func() {
		close(r.stop)
		r.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if !release {
			_ = r.rc.Close()
		}
		_ = r.m.Stop(ctx)
	})
}

// holders reads who holds each shard of the fleet's queues.
func (f *fleet) holders() map[events.Shard]string {
	f.t.Helper()
	v, err := f.store.ShardLeases(context.Background(), testNames.Prefix(), f.queues, false)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[events.Shard]string{}
	for _, l := range v.Leases {
		out[l.Shard] = l.Holder
	}
	return out
}

func (f *fleet) shards() int { return len(f.queues) * events.ShardsPerQueue }

// settled reports whether every shard is held, as the replicas' own owned
// sets say too, by the owners assign gives for candidates.
func (f *fleet) settled(cands []string, rs ...*replica) bool {
	h := f.holders()
	if len(h) != f.shards() {
		return false
	}
	var all []events.Shard
	for _, q := range f.queues {
		all = append(all, events.QueueShards(q)...)
	}
	want := assign(cands, all, "")
	for s, holder := range h {
		if want.desired[s] != holder {
			return false
		}
	}
	for _, r := range rs {
		for s := range r.m.Owned().Until {
			if h[s] != r.id {
				return false
			}
		}
		if len(r.m.Owned().Until) != want.count(r.id) {
			return false
		}
	}
	return true
}

func (a assignment) count(id string) int {
	n := 0
	for _, o := range a.desired {
		if o == id {
			n++
		}
	}
	return n
}

// testLogger logs warnings and errors through t (everything with
// CRONSTREAM_TEST_LOG set).
func testLogger(t *testing.T, id string) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("CRONSTREAM_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return testlog.Logger(t, level).With("replica", id)
}

// TestOwnershipFollowsMembership: three replicas share two queues' shards
// as assign says; a fourth joins and the shards move to their desired
// owners (handovers, counted on both sides); one leaves cleanly (its
// leases released) and its shards are taken at once by their new desired
// owners; every shard always has at most one holder.
func TestOwnershipFollowsMembership(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1", "q2")
	v := &view{}
	v.set("r1", "r2", "r3")
	fast := func(c *Config) { c.HandoverSettle = time.Second }
	r1, r2, r3 := f.start("r1", v, fast), f.start("r2", v, fast), f.start("r3", v, fast)
	testenv.Eventually(t, 10*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2, r3) }, "three replicas to own their shards")

	v.set("r1", "r2", "r3", "r4")
	r4 := f.start("r4", v, fast)
	testenv.Eventually(t, 15*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2, r3, r4) }, "the shards to move to r4")
	// Each side counts a hand-over in its report at its own next round.
	var in, out, taken uint64
	testenv.WaitFor(5*time.Second, func() bool {
		in, out, taken = 0, 0, 0
		for _, r := range []*replica{r1, r2, r3, r4} {
			rep := r.m.Report()
			in, out, taken = in+rep.HandoversIn, out+rep.HandoversOut, taken+rep.Takeovers
		}
		return in == out
	})
	if r4.m.Report().HandoversIn == 0 || in != out || taken != 0 {
		t.Errorf("handovers: r4 took %d in; %d in and %d out in all; %d takeovers", r4.m.Report().HandoversIn, in, out, taken)
	}

	var theirs []events.Shard
	for s, h := range f.holders() {
		if h == "r2" {
			theirs = append(theirs, s)
		}
	}
	r2.shutdown(true)
	v.set("r1", "r3", "r4")
	testenv.Eventually(t, 3*time.Second, func() bool {
		h := f.holders()
		for _, s := range theirs {
			if h[s] == "" || h[s] == "r2" {
				return false
			}
		}
		return true
	}, "r2's released shards to be taken within a few polls")
	testenv.Eventually(t, 20*time.Second, func() bool { return f.settled(v.Candidates(), r1, r3, r4) }, "shards to settle without r2")
	// The report is the manager's own view, taken at its next round: on a
	// loaded machine a hand-over settled in Redis may show there a round
	// later.
	var rep Report
	if !testenv.WaitFor(5*time.Second, func() bool {
		rep = r1.m.Report()
		return rep.Shards == f.shards() && rep.Owned > 0 && rep.Owned == rep.Desired && rep.UnownedCount == 0
	}) {
		t.Errorf("r1 reports %+v", rep)
	}
}

// TestTakeoverByRank: the owner of shards dies without releasing them (a
// kill) while every view still counts it: its leases lapse after the
// lease term, and each shard is taken by its rank 1 replica one step
// later, never by two; once the views drop it, the shards settle with
// their new desired owners.
func TestTakeoverByRank(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1")
	v := &view{}
	v.set("r1", "r2", "r3")
	r1, r2, r3 := f.start("r1", v, nil), f.start("r2", v, nil), f.start("r3", v, nil)
	testenv.Eventually(t, 10*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2, r3) }, "shards owned")
	var theirs []events.Shard
	for s, h := range f.holders() {
		if h == "r1" {
			theirs = append(theirs, s)
		}
	}
	killed := time.Now()
	r1.shutdown(false)
	// Every view still holds r1: rank 1 of each of its shards takes it.
	all := events.QueueShards("q1")
	ranks := map[string]assignment{"r2": assign(v.Candidates(), all, "r2"), "r3": assign(v.Candidates(), all, "r3")}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := f.holders()
		for _, s := range theirs {
			if h[s] == "" || h[s] == "r1" {
				return false
			}
		}
		return true
	}, "r1's shards taken over")
	took := time.Since(killed)
	if took > DefaultLeaseTTL+DefaultTakeoverStep+2*DefaultLeasePoll+time.Second {
		t.Errorf("takeover after %s", took)
	}
	// Rank 1 may take a shard a step before rank 2: only a poll of rank 1
	// delayed by a whole step (a loaded machine) lets rank 2 win, and the
	// lease keeps one holder either way (the ranks: TestAssignBalanced).
	h := f.holders()
	byRank1 := 0
	for _, s := range theirs {
		if ranks[h[s]].rank[s] == 1 {
			byRank1++
		}
	}
	t.Logf("%d of %d shards taken by their rank 1 replica, in %s", byRank1, len(theirs), took)
	testenv.Eventually(t, 2*time.Second, func() bool {
		return r2.m.Report().Takeovers+r3.m.Report().Takeovers == uint64(len(theirs))
	}, "a takeover counted for each of the %d shards", len(theirs))
	v.set("r2", "r3")
	testenv.Eventually(t, 20*time.Second, func() bool { return f.settled(v.Candidates(), r2, r3) }, "shards to settle without r1")
}

// TestSplitViews: two replicas see different memberships (each sees only
// itself and a third that is gone): each takes what it believes is its
// own, no shard is ever held by both, and once their views agree the
// shards settle.
func TestSplitViews(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1")
	va, vb := &view{}, &view{}
	va.set("a", "ghost")
	vb.set("b", "ghost")
	a, b := f.start("a", va, nil), f.start("b", vb, nil)
	// ghost holds nothing: its desired shards are taken by rank; a and b
	// may disagree on who is desired, and the leases keep one holder.
	testenv.Eventually(t, 15*time.Second, func() bool { return len(f.holders()) == f.shards() }, "every shard held despite the split")
	for range 20 {
		for s := range a.m.Owned().Until {
			if _, both := b.m.Owned().Until[s]; both {
				t.Fatalf("shard %s owned by a and b at once", s)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	va.set("a", "b")
	vb.set("a", "b")
	testenv.Eventually(t, 30*time.Second, func() bool { return f.settled([]string{"a", "b"}, a, b) }, "shards to settle once the views agree")
}

// TestFrozenLoopLosesShards: a replica whose firing loop stops turning (a
// hung owner) stops renewing; its shards are taken over, and when its loop
// turns again it has let them go and takes back only what is its own.
func TestFrozenLoopLosesShards(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1")
	v := &view{}
	v.set("r1", "r2")
	r1, r2 := f.start("r1", v, nil), f.start("r2", v, nil)
	testenv.Eventually(t, 10*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2) }, "shards owned")
	r1.frozen.Lock()
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, h := range f.holders() {
			if h == "r1" {
				return false
			}
		}
		return len(f.holders()) == f.shards()
	}, "r2 to take the frozen r1's shards")
	if p := r1.m.Report().Problem; p == "" {
		t.Errorf("r1's report names no problem while its loop is frozen")
	}
	r1.frozen.Unlock()
	testenv.Eventually(t, 20*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2) }, "shards to settle after the freeze")
}

// TestCutOffFromNATS: a replica that has not heard NATS for NATSLostAfter
// while another does stops renewing and takes nothing; the one that hears
// NATS takes its shards. When no replica hears NATS (a full outage) they
// keep what they hold, and a replica killed meanwhile has its shards taken
// over.
func TestCutOffFromNATS(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1")
	v := &view{}
	v.set("r1", "r2", "r3")
	var mu sync.Mutex
	heard := map[string]time.Time{}
	hear := func(id string) func() time.Time {
		return func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			if at, ok := heard[id]; ok {
				return at
			}
			return time.Now()
		}
	}
	tune := func(id string) func(*Config) { return func(c *Config) { c.HeardNATS = hear(id) } }
	r1, r2, r3 := f.start("r1", v, tune("r1")), f.start("r2", v, tune("r2")), f.start("r3", v, tune("r3"))
	testenv.Eventually(t, 10*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2, r3) }, "shards owned")

	// r1 cut off: it stops renewing; r2 and r3 (still seeing r1) take its
	// shards by rank.
	mu.Lock()
	heard["r1"] = time.Now()
	mu.Unlock()
	testenv.Eventually(t, 15*time.Second, func() bool {
		for _, h := range f.holders() {
			if h == "r1" {
				return false
			}
		}
		return len(f.holders()) == f.shards() && len(r1.m.Owned().Until) == 0
	}, "r1's shards to move while it is cut off")
	mu.Lock()
	delete(heard, "r1")
	mu.Unlock()
	v.set("r1", "r2", "r3")
	testenv.Eventually(t, 20*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2, r3) }, "r1 to take its shards back once it hears NATS")

	// Nobody hears NATS: everyone keeps its shards; r3 is killed and its
	// shards are taken over all the same.
	mu.Lock()
	out := time.Now()
	for _, id := range []string{"r1", "r2", "r3"} {
		heard[id] = out
	}
	mu.Unlock()
	time.Sleep(DefaultNATSLostAfter + 2*DefaultLeaseTTL) // well past the rule's bound and a lease term
	if !f.settled(v.Candidates(), r1, r2, r3) {
		t.Fatalf("shards moved during a full NATS outage: %v", f.holders())
	}
	r3.shutdown(false)
	testenv.Eventually(t, 15*time.Second, func() bool {
		for _, h := range f.holders() {
			if h == "r3" {
				return false
			}
		}
		return len(f.holders()) == f.shards()
	}, "r3's shards taken over during the outage")
	// The views still hold r3, its shards' desired owner: the survivors
	// keep them past the membership TTL instead of handing them to it and
	// taking them back by rank.
	out0 := r1.m.Report().HandoversOut + r2.m.Report().HandoversOut
	until := time.Now().Add(DefaultMemberTTL + 2*time.Second)
	for time.Now().Before(until) {
		if n := len(f.holders()); n != f.shards() {
			t.Fatalf("%d of %d shards held during the outage after the takeover", n, f.shards())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := r1.m.Report().HandoversOut + r2.m.Report().HandoversOut - out0; n != 0 {
		t.Errorf("%d shards handed over during the outage", n)
	}
}

// TestLeasesLostWithRedisData: Redis loses every lease (FLUSHALL); each
// owner takes its own back at its next poll, without letting its shards
// go (the owned set keeps its version).
func TestLeasesLostWithRedisData(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1", "q2")
	v := &view{}
	v.set("r1", "r2")
	r1, r2 := f.start("r1", v, nil), f.start("r2", v, nil)
	testenv.Eventually(t, 10*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2) }, "shards owned")
	// Each replica has read the other's leases (a lease taken and lost
	// between two of another replica's polls looks free all along to it).
	time.Sleep(2 * DefaultLeasePoll)
	v1, v2 := r1.m.Owned().Version, r2.m.Owned().Version
	if err := f.redis.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return f.settled(v.Candidates(), r1, r2) }, "leases taken again")
	if r1.m.Owned().Version != v1 || r2.m.Owned().Version != v2 {
		t.Errorf("owned sets changed across the data loss: versions %d→%d, %d→%d", v1, r1.m.Owned().Version, v2, r2.m.Owned().Version)
	}
}

// TestNotReadyTakesNothing: a replica whose projection is not caught up
// takes nothing and lets go of what it holds.
func TestNotReadyTakesNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, "q1")
	v := &view{}
	v.set("r1")
	var mu sync.Mutex
	ready := true
	r1 := f.start("r1", v, func(c *Config) {
		c.Ready = func() bool { mu.Lock(); defer mu.Unlock(); return ready }
	})
	testenv.Eventually(t, 10*time.Second, func() bool { return len(f.holders()) == f.shards() }, "r1 to own everything")
	mu.Lock()
	ready = false
	mu.Unlock()
	testenv.Eventually(t, 10*time.Second, func() bool { return len(f.holders()) == 0 && len(r1.m.Owned().Until) == 0 }, "r1 to let go")
	time.Sleep(2 * DefaultLeasePoll)
	if n := len(f.holders()); n != 0 {
		t.Errorf("a replica that is not ready holds %d shards", n)
	}
}
