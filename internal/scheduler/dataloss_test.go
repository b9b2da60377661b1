package scheduler_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// lossCase is an entry's config history before Redis loses its data: each
// element is one put of entry "w" firing every second.
type lossCase struct {
	name    string
	history [][]func(*events.Entry)
}

func withPayload(p string) func(*events.Entry) {
	return func(e *events.Entry) { e.Task.Payload = []byte(p) }
}

var lossCases = []lossCase{
	{"update", [][]func(*events.Entry){
		{withCatchup(events.CatchupAll, time.Hour)},
		{withCatchup(events.CatchupAll, time.Hour), withPayload("2")},
	}},
	{"queue-move", [][]func(*events.Entry){
		{withCatchup(events.CatchupAll, time.Hour), inQueue("alpha")},
		{withCatchup(events.CatchupAll, time.Hour), inQueue("beta")},
	}},
	{"move-back-latest", [][]func(*events.Entry){
		{withCatchup(events.CatchupLatest, time.Hour), inQueue("alpha")},
		{withCatchup(events.CatchupLatest, time.Hour), inQueue("beta")},
		{withCatchup(events.CatchupLatest, time.Hour), inQueue("alpha")},
	}},
}

var lossQueues = []string{"default", "alpha", "beta"}

// entryTicks returns the ticks (unix seconds) of entry's scheduled tasks
// pending in any of lossQueues.
func (e *env) entryTicks(entry string) []int64 {
	e.t.Helper()
	var out []int64
	for _, q := range lossQueues {
		out = append(out, tasksTicks(e.t, entry, e.pendingIDs(q))...)
	}
	return out
}

func tasksTicks(t testing.TB, entry string, ids []string) []int64 {
	t.Helper()
	var out []int64
	for _, id := range ids {
		rest, ok := strings.CutPrefix(id, testPrefix+":"+entry+":")
		if !ok {
			continue
		}
		tick, err := time.Parse(time.RFC3339, rest)
		if err != nil {
			t.Fatalf("task id %s: %v", id, err)
		}
		out = append(out, tick.Unix())
	}
	return out
}

// flushAndList empties Redis's database in one atomic step with listing
// entry's pending tasks, and returns their ticks: the ticks Redis held when
// it lost them.
func (e *env) flushAndList(entry string) []int64 {
	e.t.Helper()
	c := context.Background()
	var lists []*redis.StringSliceCmd
	_, err := e.rc.TxPipelined(c, func(p redis.Pipeliner) error {
		for _, q := range lossQueues {
			lists = append(lists, p.LRange(c, taskstate.Keys(q).Pending(), 0, -1))
		}
		p.FlushDB(c)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []int64
	for _, l := range lists {
		out = append(out, tasksTicks(e.t, entry, l.Val())...)
	}
	return out
}

func (e *env) putHistory(c lossCase) {
	e.t.Helper()
	for _, mods := range c.history {
		e.put(every("w", "@every 1s", mods...))
	}
}

func checkNotRefired(t *testing.T, after []int64, last int64) {
	t.Helper()
	slices.Sort(after)
	for _, s := range after {
		if s <= last {
			t.Errorf("tick %s fired again after the data loss (last handled before it: %s); ticks in Redis now: %s", fmtUnix(s), fmtUnix(last), fmtUnixes(after))
			return
		}
	}
	if len(after) == 0 {
		t.Errorf("nothing fired after the data loss")
	}
}

// TestRedisLostWhileDown: Redis loses its data (FLUSHDB) while no replica
// runs, after entries with config histories of two and more events (an
// update, queue moves) fired. The replica that starts next restores each
// watermark from the activity stream: no tick that fired before fires
// again, and every tick is handled once.
func TestRedisLostWhileDown(t *testing.T) {
	t.Parallel()
	for _, lc := range lossCases {
		t.Run(lc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.putHistory(lc)
			a := e.startNode("a", nodeOpts{})
			testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 4 }, "a to fire")
			a.stop()
			e.waitOutboxEmpty(5*time.Second, lossQueues...)
			_, lastBefore := ledgers(e.readActivity())["w"].firedRange()
			if lost := e.flushAndList("w"); len(lost) == 0 {
				t.Fatal("no task in Redis before the loss")
			}
			b := e.startNode("b", nodeOpts{})
			testenv.Eventually(t, 20*time.Second, func() bool { return b.counts().Fired >= 3 }, "b to fire after the loss")
			b.stop()
			checkNotRefired(t, e.entryTicks("w"), lastBefore)
			e.waitOutboxEmpty(5*time.Second, lossQueues...)
			acts := e.readActivity()
			l := ledgers(acts)["w"]
			first, last := l.firedRange()
			checkEverySecond(t, "w", l, first, last)
			checkLostUnknown(t, acts, "w", lastBefore)
		})
	}
}

// checkLostUnknown asserts that the stream holds one lost event of entry,
// for a restore that found no watermark: unknown, naming no tick as lost,
// up to the last tick handled before the loss.
func checkLostUnknown(t *testing.T, acts []activity, entry string, lastBefore int64) {
	t.Helper()
	var lost []events.TasksLost
	for _, a := range acts {
		if a.Type == events.TypeTaskLost && a.Lost.Entry == entry {
			lost = append(lost, a.Lost)
		}
	}
	if len(lost) != 1 {
		t.Fatalf("%d lost events of %s, want one", len(lost), entry)
	}
	l := lost[0]
	if !l.Unknown || l.ScheduledAt != nil || l.Watermark != nil || l.Count != 0 || l.Until.Unix() != lastBefore {
		t.Errorf("lost event %+v; want unknown, no watermark, no tick named, until %s", l, fmtUnix(lastBefore))
	}
}

// TestRedisLostWhileRunning: Redis loses its data while a replica fires.
// The replica re-seeds each watermark from the later of its own cursor and
// the activity stream; without a relay (nothing reached the stream) its
// cursor alone keeps every tick it handled from firing again.
func TestRedisLostWhileRunning(t *testing.T) {
	t.Parallel()
	for _, relayed := range []bool{true, false} {
		for _, lc := range lossCases[:2] {
			name := lc.name + "/relay"
			if !relayed {
				name = lc.name + "/no-relay"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				e.putHistory(lc)
				o := nodeOpts{noRelay: !relayed}
				a := e.startNode("a", o)
				testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 4 }, "a to fire")
				lost := e.flushAndList("w")
				if len(lost) == 0 {
					t.Fatal("no task in Redis before the loss")
				}
				lastBefore := slices.Max(lost)
				firedAt := a.counts().Fired
				testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= firedAt+3 }, "a to fire after the loss")
				a.stop()
				checkNotRefired(t, e.entryTicks("w"), lastBefore)
			})
		}
	}
}

// TestLaggingReplicaPromoted: Redis runs as a master with a replica; the
// replica stops following (it lags), the master goes on taking fires, then
// dies, and the replica is promoted. Either the replica that fires
// reconnects to it and finds each watermark older than its cursor, or
// (restarted) a replica starts on it and finds each watermark older than
// the activity stream's last tick. No tick the master had taken fires again
// on the promoted server.
func TestLaggingReplicaPromoted(t *testing.T) {
	t.Parallel()
	for _, restarted := range []bool{false, true} {
		name := "reconnected"
		if restarted {
			name = "restarted"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			laggingReplicaPromoted(t, restarted)
		})
	}
}

func laggingReplicaPromoted(t *testing.T, restarted bool) {
	e := newEnv(t)
	master := testenv.StartRedis(t, testenv.WithPrivateServer())
	standby := testenv.StartRedisReplica(t, master)
	c := context.Background()
	src, dst := master.Client(t), standby.Client(t)
	// The node's connections go to whichever server the switch names.
	sw := testenv.NewRedisSwitch(master)
	rc := sw.Client(t)

	e.putHistory(lossCases[0])
	o := nodeOpts{rc: rc}
	a := e.startNode("a", o)
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= 3 }, "a to fire")
	// The standby stops following: from now on it lags.
	standby.Detach(t)
	onStandby := map[int64]bool{}
	for _, s := range tasksTicks(t, "w", dst.LRange(c, taskstate.Keys("default").Pending(), 0, -1).Val()) {
		onStandby[s] = true
	}
	if len(onStandby) == 0 {
		t.Fatal("the standby holds no task")
	}
	firedAt := a.counts().Fired
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= firedAt+3 }, "a to fire on the master alone")
	// Fail over: new connections go to the standby; the master takes no
	// more writes, then dies.
	if restarted {
		a.stop() // its outbox reaches the stream
	}
	sw.Point(standby)
	if err := src.Do(c, "CLIENT", "PAUSE", "30000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	onMaster := tasksTicks(t, "w", src.LRange(c, taskstate.Keys("default").Pending(), 0, -1).Val())
	master.Kill(t)
	lastOnMaster := slices.Max(onMaster)
	if s := slices.Max(slices.Collect(maps.Keys(onStandby))); s >= lastOnMaster {
		t.Fatalf("the standby does not lag: it holds ticks up to %s, the master %s", fmtUnix(s), fmtUnix(lastOnMaster))
	}
	if restarted {
		a = e.startNode("b", o)
	}
	firedAt = a.counts().Fired
	testenv.Eventually(t, 30*time.Second, func() bool { return a.counts().Fired >= firedAt+3 }, "firing on the promoted standby")
	a.stop()
	var fresh []int64
	for _, s := range tasksTicks(t, "w", dst.LRange(c, taskstate.Keys("default").Pending(), 0, -1).Val()) {
		if !onStandby[s] {
			fresh = append(fresh, s)
		}
	}
	checkNotRefired(t, fresh, lastOnMaster)
}

// TestRedisLostUnderConfirmingReplica: two replicas run an entry registered
// after both started, so the one that is not its primary knows the entry's
// watermark only from confirming the primary's fires. Redis loses its data,
// writes stay paused beyond the late delay, and the primary dies meanwhile:
// the other replica takes the entry over on an empty Redis. It must restore
// the watermark (from what it confirmed and the activity stream), not take
// the vanished watermark for an entry that never fired: no tick whose event
// reached the stream fires again.
func TestRedisLostUnderConfirmingReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.startNode("a", nodeOpts{})
	b := e.startNode("b", nodeOpts{})
	e.put(every("w", "@every 1s", withCatchup(events.CatchupAll, time.Hour)))
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired+b.counts().Fired >= 5 }, "the primary to fire")
	primary, other := a, b
	if b.counts().Fired > a.counts().Fired {
		primary, other = b, a
	}
	_, lastStream := ledgers(e.readActivity())["w"].firedRange()

	// One step: the data goes, and writes wait 3 s (longer than the late
	// delay, so the other replica's next attempt is its own, not a
	// confirmation of a fire).
	c := context.Background()
	if _, err := e.rc.TxPipelined(c, func(p redis.Pipeliner) error {
		p.FlushDB(c)
		p.Do(c, "CLIENT", "PAUSE", "3000", "WRITE")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	primary.crash()
	firedAt := other.counts().Fired
	testenv.Eventually(t, 30*time.Second, func() bool { return other.counts().Fired >= firedAt+3 }, "the other replica to fire after the loss")
	other.stop()
	checkNotRefired(t, e.entryTicks("w"), lastStream)
}

// slowPass is a History whose whole-stream read of last fires never answers
// before it is given up: a stream server too slow, or a replica too starved
// of CPU, to read it in time.
type slowPass struct{ scheduler.History }

func (slowPass) LastHandledAll(ctx context.Context) (map[string]time.Time, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStreamCheckOffTheLoop: while a replica that took shards over waits
// for the stream's last fires to check their watermarks, its loop goes on
// firing the entries it already owned, on time. (b may have fired some of
// a's entries itself before, and then needs no read for them.)
func TestStreamCheckOffTheLoop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.putEverySecond("o", 24)
	a := e.startNode("a", nodeOpts{})
	b := e.startNode("b", nodeOpts{sched: func(c *scheduler.Config) {
		c.History = slowPass{scheduler.NewStreamHistory(e.js, testNames)}
	}})
	testenv.Eventually(t, 30*time.Second, func() bool { return a.counts().Fired >= 24 && b.counts().Fired >= 24 }, "both replicas to fire")
	// Settled: each owns its share (a loaded machine can take longer
	// than the handovers' usual couple of seconds), then fires for a while.
	testenv.Eventually(t, 30*time.Second, func() bool {
		ra, rb := a.own.Report(), b.own.Report()
		return ra.Owned == ra.Desired && rb.Owned == rb.Desired && ra.Owned > 0 && rb.Owned > 0
	}, "each replica to own its share")
	time.Sleep(3 * time.Second)
	handover := time.Now()
	a.stop()
	firedBefore := b.counts().Fired
	testenv.Eventually(t, 20*time.Second, func() bool { return b.counts().Fired >= firedBefore+uint64(3*len(ids)) }, "b to fire every entry")
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")

	// b's own entries: those it fired while the shares held, in the
	// seconds before the handover. Not the last second: a's fires of that
	// tick may have been cut short by its stop, and b fired them after.
	own := map[string]bool{}
	acts := e.readActivity()
	for _, act := range acts {
		f := act.Fired
		if act.Type == events.TypeEntryFired && f.Replica == "b" && f.ScheduledAt.After(handover.Add(-3*time.Second)) && f.ScheduledAt.Before(handover.Add(-time.Second)) {
			own[f.Entry] = true
		}
	}
	if len(own) == 0 || len(own) == len(ids) {
		t.Fatalf("b owned %d of %d entries before the handover, want some", len(own), len(ids))
	}
	for _, act := range acts {
		f := act.Fired
		if act.Type != events.TypeEntryFired || !own[f.Entry] || f.ScheduledAt.Before(handover) {
			continue
		}
		if lag := f.EnqueuedAt.Sub(f.ScheduledAt); lag > 1200*time.Millisecond {
			t.Errorf("entry %s, owned by b before a left: tick %s fired %s late while b checked a's entries", f.Entry, f.ScheduledAt.Format("15:04:05"), lag)
		}
	}
	for id, l := range ledgers(acts) {
		first, last := l.firedRange()
		checkEverySecond(t, id, l, first, last)
	}
}

// putEverySecond registers n entries "@every 1s" named prefix00, prefix01…
// and returns their ids.
func (e *env) putEverySecond(prefix string, n int) []string {
	e.t.Helper()
	ids := make([]string, n)
	e.put(entriesOf(n, func(i int) events.Entry {
		ids[i] = fmt.Sprintf("%s%02d", prefix, i)
		return every(ids[i], "@every 1s")
	})...)
	return ids
}
