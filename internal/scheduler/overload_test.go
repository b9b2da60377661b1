package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/promtest"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

// throttled is a replica's Redis with a fixed capacity: its fire calls go
// one at a time, each holding the line perFire per fire, so the replica
// can fire 1/perFire a second whatever the machine. It counts the fires
// answered, by the second they were answered in.
type throttled struct {
	scheduler.Broker
	perFire time.Duration

	line     sync.Mutex
	mu       sync.Mutex
	bySecond map[int64]int
}

func (b *throttled) FireBatchInto(ctx context.Context, fences taskstate.Fences, fires []taskstate.Fire, results []taskstate.FireResult) ([]taskstate.FireResult, error) {
	b.line.Lock()
	t := time.NewTimer(time.Duration(len(fires)) * b.perFire)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	b.line.Unlock()
	res, err := b.Broker.FireBatchInto(ctx, fences, fires, results)
	n := 0
	for _, r := range res {
		if r.Err == nil {
			n++
		}
	}
	b.mu.Lock()
	b.bySecond[time.Now().Unix()] += n
	b.mu.Unlock()
	return res, err
}

// fires returns the fires answered in each second of [from, to).
func (b *throttled) fires(from, to time.Time) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int
	for s := from.Unix(); s < to.Unix(); s++ {
		out = append(out, b.bySecond[s])
	}
	return out
}

// watching counts a replica's fire attempts on a set of shards.
type watching struct {
	scheduler.Broker
	shards atomic.Pointer[map[events.Shard]bool]
	hits   atomic.Int64
}

func (b *watching) FireBatchInto(ctx context.Context, fences taskstate.Fences, fires []taskstate.Fire, results []taskstate.FireResult) ([]taskstate.FireResult, error) {
	if w := b.shards.Load(); w != nil {
		for i := range fires {
			if (*w)[events.ShardOfEntry(fires[i].Queue, fires[i].Entry)] {
				b.hits.Add(1)
			}
		}
	}
	return b.Broker.FireBatchInto(ctx, fences, fires, results)
}

// TestOverloadDegrades offers one replica twice what it can fire (400
// entries every second in its shards, through a Redis line that takes
// 200 fires a second) beside a second replica with entries of its own. The
// overloaded replica keeps firing at its capacity, second after second;
// its entries fall behind and show as late in its stall detector, the
// late-entries metric and its heartbeat (what status shows); it keeps its
// shards, and the other replica never makes an attempt on them (there are
// no late attempts with ownership). What it shows it can fire is what it
// fires.
func TestOverloadDegrades(t *testing.T) {
	// Not parallel: it measures what a replica fires against a fixed
	// capacity, which the package's other tests would take CPU from.
	const capacity = 200 // fires a second through the throttled line
	e := newEnv(t)
	e.put(every("seed", "@every 1s", inQueue("qa")))
	line := &throttled{Broker: taskstate.New(e.redis.Client(t)), perFire: time.Second / capacity, bySecond: map[int64]int{}}
	var det, behindDet atomic.Pointer[stall.Detector]
	a := e.startNode("overloaded", nodeOpts{
		sched: func(c *scheduler.Config) {
			// Passes of 50 fires: the loop turns (and its leases are
			// renewed) four times a second however far behind it is. Two
			// batches of 25 in flight: one waits at the line while the
			// other's answer comes back from Redis, so the line's
			// capacity is what is measured, not how soon a machine busy
			// with other tests runs the loop again.
			c.Batch, c.Parallel, c.Broker = 25, 2, line
			c.OnOutcome = func(o schedule.Outcome) {
				if d := det.Load(); d != nil {
					d.Outcome(o)
				}
				if d := behindDet.Load(); d != nil {
					d.Outcome(o)
				}
			}
		},
		info: func(i *replica.Info) {
			if d := det.Load(); d != nil {
				i.Late = d.Late(32)
			}
		},
	})
	other := &watching{Broker: taskstate.New(e.redis.Client(t))}
	b := e.startNode("other", nodeOpts{sched: func(c *scheduler.Config) { c.Broker = other }})
	mine := watchOwnShare(t, a, b, other)

	reg := prometheus.NewRegistry()
	d := startDetector(t, a, reg)
	det.Store(d)
	// A detector as a replica runs one, late after longer than the catch-up
	// grace: no tick stays overdue that long (the fires skip the ticks
	// past the grace), so only the missed ticks show the overload.
	behind := startDetectorLateAfter(t, a, prometheus.NewRegistry(), 2*scheduler.DefaultGrace)
	behindDet.Store(behind)

	// Twice the capacity in the overloaded replica's shards, a little in
	// the other's.
	var offered, others []string
	for i := 0; len(offered) < 2*capacity || len(others) < 10; i++ {
		id := fmt.Sprintf("ov-%05d", i)
		switch {
		case mine[events.ShardOfEntry("qa", id)] && len(offered) < 2*capacity:
			offered = append(offered, id)
		case !mine[events.ShardOfEntry("qa", id)] && len(others) < 10:
			others = append(others, id)
		}
	}
	for _, id := range append(slices.Clone(offered), others...) {
		e.put(every(id, "@every 1s", inQueue("qa")))
	}

	// Behind from the first seconds; measured once the backlog is steady.
	waitUntil(t, time.Now, time.Now().Add(8*time.Second))
	from := time.Now().Truncate(time.Second).Add(time.Second)
	until := from.Add(10 * time.Second)
	keepsShards(t, a, b, mine, until.Add(time.Second))
	perSecond := line.fires(from, until)
	total := 0
	for i := 0; i+1 < len(perSecond); i += 2 {
		two := perSecond[i] + perSecond[i+1]
		total += two
		if float64(two) < 0.75*2*capacity {
			t.Errorf("fires in seconds %d-%d of the window: %d, want at least %.0f (steady at its capacity): %v", i, i+1, two, 0.75*2*capacity, perSecond)
		}
	}
	rate := float64(total) / float64(len(perSecond))
	t.Logf("offered %d fires a second, fired %.0f a second: %v", 2*capacity, rate, perSecond)
	if rate < 0.85*capacity {
		t.Errorf("fired %.0f a second, want at least %.0f (0.85 of its capacity)", rate, 0.85*capacity)
	}
	if hits := other.hits.Load(); hits != 0 {
		t.Errorf("the other replica made %d fire attempts on the overloaded replica's shards", hits)
	}
	if shown, ok := a.sched.Capacity(); !ok || shown.PerSecond < 0.7*capacity || shown.PerSecond > 1.5*capacity {
		t.Errorf("the overloaded replica shows a capacity of %+v (%v), want about %d a second", shown, ok, capacity)
	}

	lateShown(t, e, a, d, reg, offered, others, capacity/2)
	behindShown(t, behind, offered, others, capacity/2)
	historyFollows(t, e, offered, from, until)
}

// historyFollows checks that asynq's enqueue history (`asynq cron
// history`, asynqmon) shows most of the offered entries' fires between
// from and until although their backlog never cleared: the passes keep
// its records only briefly while a backlog lasts.
func historyFollows(t *testing.T, e *env, offered []string, from, until time.Time) {
	t.Helper()
	rc := e.redis.Client(t)
	ctx := testenv.Context(t, 10*time.Second)
	shown := 0
	for _, id := range offered {
		n, err := rc.ZCount(ctx, taskstate.SchedulerHistoryKey(id), strconv.FormatInt(from.Unix(), 10), strconv.FormatInt(until.Unix(), 10)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			shown++
		}
	}
	if shown < len(offered)*3/4 {
		t.Errorf("asynq's enqueue history shows fires of %d of the %d overloaded entries from %s to %s, want most", shown, len(offered), from.Format(time.TimeOnly), until.Format(time.TimeOnly))
	}
}

// behindShown checks that at least want of the offered entries (and none
// of others) show as late in d for the ticks their fires skipped as
// missed.
func behindShown(t *testing.T, d *stall.Detector, offered, others []string, want int) {
	t.Helper()
	reasons := map[string]string{}
	for _, l := range d.Late(0) {
		reasons[l.Entry] = l.Reason
	}
	n := 0
	for _, id := range offered {
		if strings.Contains(reasons[id], "ticks skipped as missed") {
			n++
		}
	}
	if n < want {
		t.Errorf("the stall detector (late after %s) lists %d of the %d offered entries as behind, want most: %v", 2*scheduler.DefaultGrace, n, len(offered), reasons)
	}
	for _, id := range others {
		if r, ok := reasons[id]; ok {
			t.Errorf("entry %s of the replica that keeps up is listed late: %s", id, r)
		}
	}
}

// startDetector runs a stall detector for node a's shards, as a replica
// does, with its metrics in reg.
func startDetector(t *testing.T, a *node, reg *prometheus.Registry) *stall.Detector {
	t.Helper()
	return startDetectorLateAfter(t, a, reg, 3*time.Second)
}

func startDetectorLateAfter(t *testing.T, a *node, reg *prometheus.Registry, lateAfter time.Duration) *stall.Detector {
	t.Helper()
	d, err := stall.New(stall.Config{Watermarks: a.store, Projection: a.proj, Names: testNames, Now: time.Now,
		LateAfter: lateAfter, Shards: a.own, Firing: a.sched.Firing, Logger: testLogger(t), Metrics: stall.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	return d
}

// watchOwnShare waits until a and b (b firing through other) each own
// their share of queue qa's shards, and returns a's, which other then
// watches for b's attempts.
func watchOwnShare(t *testing.T, a, b *node, other *watching) map[events.Shard]bool {
	t.Helper()
	settledOwners(t, []string{"qa"}, 30*time.Second, a, b)
	testenv.Eventually(t, 20*time.Second, func() bool {
		ra, rb := a.own.Report(), b.own.Report()
		return ra.Owned == ra.Desired && rb.Owned == rb.Desired && ra.Owned > 0 && rb.Owned > 0
	}, "each replica to own its share")
	mine := map[events.Shard]bool{}
	for s := range a.own.Owned().Until {
		mine[s] = true
	}
	other.shards.Store(&mine)
	return mine
}

// keepsShards checks, until until, that a keeps the shards mine and b
// never holds one of them.
func keepsShards(t *testing.T, a, b *node, mine map[events.Shard]bool, until time.Time) {
	t.Helper()
	sample := time.NewTicker(250 * time.Millisecond)
	defer sample.Stop()
	for ; time.Now().Before(until); <-sample.C {
		for s := range b.own.Owned().Until {
			if mine[s] {
				t.Errorf("the other replica holds the overloaded replica's shard %s", s)
				return
			}
		}
		held := a.own.Owned().Until
		for s := range mine {
			if _, ok := held[s]; !ok {
				t.Errorf("the overloaded replica lost its shard %s", s)
				return
			}
		}
	}
}

// lateShown checks that at least want of the offered entries (and none
// of others) show as late in a's stall detector d, its metric and its
// heartbeat (what status shows).
func lateShown(t *testing.T, e *env, a *node, d *stall.Detector, reg *prometheus.Registry, offered, others []string, want int) {
	t.Helper()
	late := d.Late(1000)
	lateIDs := map[string]bool{}
	for _, l := range late {
		lateIDs[l.Entry] = true
	}
	n := 0
	for _, id := range offered {
		if lateIDs[id] {
			n++
		}
	}
	if n < want {
		t.Errorf("the stall detector lists %d of the %d offered entries as late, want most", n, len(offered))
	}
	for _, id := range others {
		if lateIDs[id] {
			t.Errorf("entry %s of the replica that keeps up is listed late", id)
		}
	}
	if v, ok := promtest.Value(t, reg, "cronstream_late_entries"); !ok || v < float64(want) {
		t.Errorf("cronstream_late_entries = %v (gathered: %t), want most of the %d offered entries", v, ok, len(offered))
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		infos, err := replica.ListReplicas(testenv.Context(t, 5*time.Second), e.js, testNames)
		if err != nil {
			return false
		}
		for _, info := range infos {
			if info.ID == a.id {
				return len(info.Late) > 0
			}
		}
		return false
	}, "the overloaded replica's heartbeat (status) to list late entries")
}
