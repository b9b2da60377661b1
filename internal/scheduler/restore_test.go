package scheduler_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

// TestRedisLostAheadOfAnotherReplica: two replicas both try an entry's
// ticks (as replicas of two builds do during a rolling upgrade, or two
// owners of one shard across a handover): the primary on time, the other
// 800 ms late (its clock runs behind). The primary fires a tick, and Redis
// loses its data before any relay published the tick's record, so neither
// Redis nor the activity stream holds it. The other replica, whose own
// position is one tick older (it had not yet tried that tick), finds the
// watermark gone first, while the primary does not try its next tick (its
// clock is set back an hour). The restore must take the primary's
// position: the tick it fired is never fired again.
func TestRedisLostAheadOfAnotherReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("w", "@every 1s", withCatchup(events.CatchupAll, time.Hour)))
	clocks := map[string]*shiftClock{"a": newShiftClock(t, 0), "b": newShiftClock(t, -800*time.Millisecond)}
	var held atomic.Int64 // outcomes reporting a fire held for the restore
	opts := func(id string) nodeOpts {
		// No relay: nothing reaches the stream, and no replica hears
		// another's fires; each knows only what its own attempts read.
		return nodeOpts{noRelay: true, ownsAll: true, clock: clocks[id].clock, sched: func(c *scheduler.Config) {
			c.OnOutcome = func(o schedule.Outcome) {
				if errors.Is(o.Err, scheduler.ErrRestoring) {
					held.Add(1)
				}
			}
		}}
	}
	a, b := e.startNode("a", opts("a")), e.startNode("b", opts("b"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return len(a.members.Live()) == 2 && len(b.members.Live()) == 2 && a.counts().Fired+b.counts().Fired >= 3
	}, "both replicas live and the entry firing")
	primary, other, id := a, b, "a"
	c := context.Background()
	watermark := func() time.Time {
		tick, _, _, err := e.store.Watermark(c, testPrefix, "default", "w")
		if err != nil {
			t.Fatal(err)
		}
		return tick
	}
	// Right after the primary fired a tick (the other replica tries it
	// 800 ms later): the primary stops trying, and Redis loses its data.
	before := watermark()
	testenv.Eventually(t, 10*time.Second, func() bool { return watermark().After(before) }, "the primary to fire the next tick")
	clocks[id].set(t, -time.Hour)
	lost := e.flushAndList("w")
	if len(lost) == 0 {
		t.Fatal("no task in Redis before the loss")
	}
	lastBefore := slices.Max(lost)

	firedAt := other.counts().Fired
	testenv.Eventually(t, 30*time.Second, func() bool { return other.counts().Fired >= firedAt+3 }, "the other replica to fire after the loss")
	clocks[id].set(t, 0)
	firedAt = primary.counts().Fired + other.counts().Fired
	testenv.Eventually(t, 20*time.Second, func() bool {
		return primary.counts().Fired+other.counts().Fired >= firedAt+3
	}, "both replicas to fire on")
	primary.stop()
	other.stop()
	checkNotRefired(t, e.entryTicks("w"), lastBefore)
	if held.Load() == 0 {
		t.Error("no replica reported the entry's fires held for the restore (Outcome ErrRestoring)")
	}
}

// pendingTicksByEntry returns the ticks (unix seconds) of the scheduled
// tasks pending in queue, by entry.
func (e *env) pendingTicksByEntry(ids []string) map[string][]int64 {
	e.t.Helper()
	out := map[string][]int64{}
	for _, id := range ids {
		rest, ok := strings.CutPrefix(id, testPrefix+":")
		if !ok {
			continue
		}
		entry, tickText, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		tick, err := time.Parse(time.RFC3339, tickText)
		if err != nil {
			e.t.Fatalf("task id %s: %v", id, err)
		}
		out[entry] = append(out[entry], tick.Unix())
	}
	return out
}

// TestRedisLostWhileNATSDown: Redis loses its data while the only NATS
// server is down, under two running replicas that started on watermarks
// already in Redis (so they never read the config event counts), with 20
// entries firing every second. The replicas restore every watermark from
// their own positions without the stream, and keep firing: every entry
// fires again within a few seconds (the reload is not let through one
// entry per second), no tick Redis held fires again, and none is missed.
func TestRedisLostWhileNATSDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 20
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "e" + string(rune('a'+i))
		e.put(every(ids[i], "@every 1s", withCatchup(events.CatchupAll, time.Hour)))
	}
	// A first replica leaves a watermark for every entry, and stops.
	first := e.startNode("first", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return first.counts().Fired >= 2*n }, "every entry to fire")
	first.stop()
	a := e.startNode("a", nodeOpts{})
	b := e.startNode("b", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired+b.counts().Fired >= 3*n }, "a and b to fire every entry")

	e.nats.Shutdown()
	firedAt := a.counts().Fired + b.counts().Fired
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired+b.counts().Fired >= firedAt+2*n }, "firing on with NATS down")

	lost := e.flushAllAndList()
	flushed := time.Now()
	for _, id := range ids {
		if len(lost[id]) == 0 {
			t.Fatalf("entry %s had no task in Redis before the loss", id)
		}
	}
	// Every entry fires twice more while NATS is still down, soon.
	testenv.Eventually(t, 15*time.Second, func() bool {
		now := e.pendingTicksByEntry(e.pendingIDs("default"))
		for _, id := range ids {
			if len(now[id]) < 2 {
				return false
			}
		}
		return true
	}, "every entry to fire twice after the loss, with NATS down")
	t.Logf("every entry fired twice %s after the loss", time.Since(flushed).Round(time.Millisecond))
	testenv.Eventually(t, 10*time.Second, func() bool {
		return a.counts().Restoring+b.counts().Restoring == 0
	}, "no entry held for a restore any more")

	e.nats.Restart(t)
	firedAt = a.counts().Fired + b.counts().Fired
	testenv.Eventually(t, 30*time.Second, func() bool { return a.counts().Fired+b.counts().Fired >= firedAt+2*n }, "firing on with NATS back")
	a.stop()
	b.stop()
	after := e.pendingTicksByEntry(e.pendingIDs("default"))
	for _, id := range ids {
		ticks := after[id]
		slices.Sort(ticks)
		lastBefore := slices.Max(lost[id])
		checkNotRefired(t, ticks, lastBefore)
		for i, s := range ticks {
			if want := lastBefore + 1 + int64(i); s != want {
				t.Errorf("entry %s: after the loss fired %s, want every second from %s: %s", id, fmtUnix(s), fmtUnix(lastBefore+1), fmtUnixes(ticks))
				break
			}
		}
	}
}

// flushAllAndList empties Redis's database in one atomic step with listing
// the default queue's pending tasks, and returns their ticks by entry.
func (e *env) flushAllAndList() map[string][]int64 {
	e.t.Helper()
	c := context.Background()
	var list *redis.StringSliceCmd
	_, err := e.rc.TxPipelined(c, func(p redis.Pipeliner) error {
		list = p.LRange(c, taskstate.Keys("default").Pending(), 0, -1)
		p.FlushDB(c)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.pendingTicksByEntry(list.Val())
}

// TestInGraceTicksFireAfterLongRedisLoss: Redis is down for longer than the
// grace and comes back empty. The replica records the ticks older than the
// grace as missed, holds its fires until the restore settles, and then
// fires every tick still within the grace. Neither the step refused on the
// lost watermark nor the hold for the restore says the replica cannot keep
// up; if they did, it would fire only the latest tick and skip the ones
// still within the grace.
func TestInGraceTicksFireAfterLongRedisLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.redis = testenv.StartRedis(t, testenv.WithPrivateServer())
	e.rc = e.redis.Client(t)
	e.store = taskstate.New(e.rc)
	ids := []string{"ga", "gb", "gc", "gd", "ge"}
	for _, id := range ids {
		e.put(every(id, "@every 1s"))
	}
	a := e.startNode("a", nodeOpts{})
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Fired >= uint64(3*len(ids)) }, "every entry to fire")
	e.redis.Stop(t)
	lostAt := time.Now()
	// The outage itself: it must outlast the grace for ticks to be missed.
	time.Sleep(scheduler.DefaultGrace + 2*time.Second)
	e.redis.Start(t)
	firedAt := a.counts().Fired
	testenv.Eventually(t, 30*time.Second, func() bool { return a.counts().Fired >= firedAt+uint64(8*len(ids)) }, "firing again after the loss")
	a.stop()

	acts := e.readActivity()
	enqueued := map[string]map[int64]time.Time{}
	for _, act := range acts {
		if act.Type == events.TypeEntryFired {
			if enqueued[act.Fired.Entry] == nil {
				enqueued[act.Fired.Entry] = map[int64]time.Time{}
			}
			enqueued[act.Fired.Entry][act.Fired.ScheduledAt.Unix()] = act.Fired.EnqueuedAt
		}
	}
	ls := ledgers(acts)
	for _, id := range ids {
		l := ls[id]
		var after *events.Skipped
		for i, sk := range l.skipped {
			if sk.Reason == events.SkipMissed && !sk.ScheduledAt.Before(lostAt.Add(-time.Second)) {
				after = &l.skipped[i]
			}
		}
		if after == nil {
			t.Errorf("entry %s: no missed ticks recorded after an outage longer than the grace", id)
			continue
		}
		last := after.ScheduledAt
		if after.Until != nil {
			last = *after.Until
		}
		firedNext, ok := enqueued[id][last.Unix()+1]
		if !ok {
			t.Errorf("entry %s: the tick after the missed run %s..%s never fired", id, after.ScheduledAt.Format("15:04:05"), last.Format("15:04:05"))
			continue
		}
		if !last.Before(firedNext.Add(-scheduler.DefaultGrace)) {
			t.Errorf("entry %s: ticks up to %s recorded missed in a step at %s, within the grace of %s", id,
				last.Format("15:04:05"), firedNext.Format("15:04:05.000"), scheduler.DefaultGrace)
		}
		_, lastFired := l.firedRange()
		checkEverySecond(t, id, l, after.ScheduledAt.Unix(), lastFired)
	}
}
