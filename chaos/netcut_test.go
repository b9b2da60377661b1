package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

const (
	// cutStaleness is the replicas' --max-staleness in the network cut.
	cutStaleness = 5 * time.Second
	// cutSlack is what the staleness fence may take beyond max-staleness:
	// fresh_as_of is when a projection last heard the config stream, which
	// on an idle stream moves with the consumer's heartbeats (2 s) and lags
	// by up to about four of them (the projector counts a quiet wait of
	// 2.25 heartbeats as heard two heartbeats back), plus a fire batch in
	// flight when the bound passes.
	cutSlack   = 10 * time.Second
	cutEntries = 30
)

var cutQueues = []string{"n0", "n1", "n2"}

// sampler polls a number every 200 ms, so a test can tell when it last
// changed. Its goroutine is stopped by stop (also at cleanup).
type sampler struct {
	mu      sync.Mutex
	samples []sample
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

type sample struct {
	at time.Time
	v  float64
}

func startSampler(t *testing.T, read func() float64) *sampler {
	s := &sampler{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			v := read()
			s.mu.Lock()
			s.samples = append(s.samples, sample{time.Now(), v})
			s.mu.Unlock()
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *sampler) stop() {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
}

// lastIncrease returns the time of the last sample in [from, to] that was
// above the sample before it (an upper bound of the last increment), or
// the zero time when the value never rose in the window.
func (s *sampler) lastIncrease(from, to time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last time.Time
	for i := 1; i < len(s.samples); i++ {
		cur, prev := s.samples[i], s.samples[i-1]
		if cur.at.Before(from) || cur.at.After(to) || cur.v < 0 || prev.v < 0 {
			continue
		}
		if cur.v > prev.v {
			last = cur.at
		}
	}
	return last
}

// cutWindow is one cut and heal of the isolated replica.
type cutWindow struct {
	mode                    testenv.CutMode
	cutAt, bound, healAt    time.Time
	stoppedAfter, resumedIn time.Duration
}

// TestNetworkCut isolates one replica from NATS through a TCP proxy while
// Redis stays reachable: the replica must stop firing within the staleness
// bound while the others fire every tick, resume after the heal, and no
// tick may fire twice. It cuts twice: a blackhole (no resets, the client
// cannot tell) and a drop (connections closed, reconnects refused).
func TestNetworkCut(t *testing.T) {
	if testing.Short() {
		t.Skip("network cut: real processes for a minute; skipped with -short")
	}
	began := time.Now()
	n := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	px := testenv.StartProxy(t, strings.TrimPrefix(n.URL(), "nats://"))
	s := newSystem(t, systemConfig{
		replicaNATS: []string{n.URL(), n.URL(), "nats://" + px.Addr()}, adminNATS: n.URL(), js: n.JetStream(t),
		redis: rd, streamReplicas: 1, maxStaleness: cutStaleness, queues: cutQueues,
	})
	const isolated = 2
	isolatedID := s.replicas[isolated].id
	for i := range s.replicas {
		s.startReplica(i)
	}
	s.waitReady(60 * time.Second)
	ids := entryIDs(cutEntries)
	s.registerEntries(ids)
	fires := func() float64 { return s.metric(isolated, "cronstream_fires_total") }
	testenv.Eventually(t, 30*time.Second, func() bool { return fires() >= 5 },
		"replica %s fires its share of the entries", isolatedID)
	smp := startSampler(t, fires)
	t.Logf("setup done in %s", time.Since(began).Round(100*time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var windows []cutWindow
	for _, mode := range []testenv.CutMode{testenv.Blackhole, testenv.Drop} {
		// The isolated replica fires before each cut.
		f0 := fires()
		testenv.Eventually(t, 30*time.Second, func() bool { return fires() > f0 },
			"replica %s fires before the %s cut", isolatedID, mode)

		w := cutWindow{mode: mode, cutAt: time.Now()}
		px.Cut(mode)
		w.bound = w.cutAt.Add(cutStaleness + cutSlack)
		t.Logf("%s: cut replica %s off NATS; its fires must stop by +%s", mode, isolatedID, cutStaleness+cutSlack)

		// The others keep firing every entry past the bound (gaps are
		// caught by the final check); by then the isolated replica must
		// have stopped.
		probe := w.bound.Add(3 * time.Second).Truncate(time.Second).Add(time.Second)
		testenv.Eventually(t, 60*time.Second, func() bool { return allFired(ctx, s, ids, probe) },
			"the other replicas fire every entry's tick %s during the %s cut", probe.Format(time.TimeOnly), mode)
		last := smp.lastIncrease(w.cutAt, time.Now())
		if !last.IsZero() {
			w.stoppedAfter = last.Sub(w.cutAt)
		}
		if last.After(w.bound) {
			t.Errorf("%s: replica %s still fired %s after the cut (bound %s)", mode, isolatedID, w.stoppedAfter.Round(100*time.Millisecond), cutStaleness+cutSlack)
		}

		w.healAt = time.Now()
		px.Heal()
		f1 := fires()
		testenv.Eventually(t, 30*time.Second, func() bool { return fires() > f1 },
			"replica %s fires again after the %s cut heals (its /readyz and fire metrics now: %s)", isolatedID, mode,
			lazy(func() string {
				code, body := s.readyz(isolated)
				return fmt.Sprintf("%d %s\n%s", code, body, s.metricLines(isolated, "cronstream_fire"))
			}))
		w.resumedIn = time.Since(w.healAt)
		windows = append(windows, w)
		t.Logf("%s: last fire %s after the cut (bound %s); fires again %s after the heal", mode,
			w.stoppedAfter.Round(100*time.Millisecond), cutStaleness+cutSlack, w.resumedIn.Round(100*time.Millisecond))
	}
	smp.stop()

	// Steady, then stop firing and count.
	s.waitReady(60 * time.Second)
	f0 := s.totalFires()
	testenv.Eventually(t, 60*time.Second, func() bool { return s.totalFires() >= f0+3*cutEntries },
		"steady firing after the last heal")
	pauseAt := time.Now()
	s.pauseEntries(ids)
	end := checkEnd(pauseAt)
	settle(t, s, nil, nil, pauseAt)
	snap, err := snapshotRedis(ctx, s.rdb, cutQueues)
	if err != nil {
		t.Fatalf("snapshot Redis: %v", err)
	}
	acts, err := readActivity(ctx, s.js, s.names)
	if err != nil {
		t.Fatalf("read activity: %v", err)
	}
	entryQueue := map[string]string{}
	for i, id := range ids {
		entryQueue[id] = queueOf(i, cutQueues)
	}
	rep := check(ctx, s.rdb, checkInput{entries: ids, entryQueue: entryQueue, end: end, snap: snap, acts: acts})

	// From the stream: fires of the isolated replica inside a cut after
	// the bound, the others' fire lag, and how long their events waited.
	var lateIsolated int
	var maxLag, maxPublishDelay [2]time.Duration
	for _, a := range acts {
		f := a.fired
		if f == nil {
			continue
		}
		for wi, w := range windows {
			if f.ScheduledAt.Before(w.cutAt) || f.ScheduledAt.After(w.healAt) {
				continue
			}
			if f.Replica == isolatedID {
				if f.EnqueuedAt.After(w.bound) {
					lateIsolated++
					rep.example("fire by the cut replica after the bound", "%s %s at +%s", f.Entry, f.ScheduledAt.Format(time.TimeOnly), f.EnqueuedAt.Sub(w.cutAt).Round(100*time.Millisecond))
				}
				continue
			}
			maxLag[wi] = max(maxLag[wi], f.EnqueuedAt.Sub(f.ScheduledAt))
			maxPublishDelay[wi] = max(maxPublishDelay[wi], a.stored.Sub(f.EnqueuedAt))
		}
	}

	var sum strings.Builder
	fmt.Fprintf(&sum, "=== network cut summary: %d entries @every 1s, 3 replicas, %s isolated through a TCP proxy, --max-staleness %s, total %s\n",
		cutEntries, isolatedID, cutStaleness, time.Since(began).Round(time.Second))
	for wi, w := range windows {
		fmt.Fprintf(&sum, "  %s cut for %s: last fire of %s %s after the cut (bound %s), fires again %s after the heal; others' max fire lag %s, max event publish delay %s\n",
			w.mode, w.healAt.Sub(w.cutAt).Round(100*time.Millisecond), isolatedID, w.stoppedAfter.Round(100*time.Millisecond),
			cutStaleness+cutSlack, w.resumedIn.Round(100*time.Millisecond), maxLag[wi].Round(10*time.Millisecond), maxPublishDelay[wi].Round(10*time.Millisecond))
	}
	fmt.Fprintf(&sum, "  fires by the cut replica after the bound (from the stream): %d\n", lateIsolated)
	fmt.Fprintf(&sum, "  checked ticks up to %s\n", end.UTC().Format(time.RFC3339))
	sum.WriteString(rep.String())
	t.Log(sum.String())

	if lateIsolated > 0 {
		t.Errorf("replica %s fired %d ticks after the staleness bound while cut off", isolatedID, lateIsolated)
	}
	if rep.duplicates() > 0 {
		t.Errorf("%d duplicates", rep.duplicates())
	}
	if rep.lost() > 0 {
		t.Errorf("%d lost events or tasks", rep.lost())
	}
	if rep.missedOutside > 0 || rep.neverFired > 0 {
		t.Errorf("%d ticks missed, %d entries never fired: the other replicas must fire every tick during the cut", rep.missedOutside, rep.neverFired)
	}
	for _, r := range s.replicas {
		for _, u := range r.unexpectedExits() {
			t.Errorf("unexpected process exit: %s", u)
		}
	}
}

// allFired reports whether every entry's task for tick is in Redis.
func allFired(ctx context.Context, s *system, ids []string, tick time.Time) bool {
	pipe := s.rdb.Pipeline()
	for i, id := range ids {
		pipe.Exists(ctx, taskstate.Keys(queueOf(i, cutQueues)).Task(schedule.TaskID(prefix, id, tick)))
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil {
		return false
	}
	for _, c := range cmds {
		if n, err := c.(interface{ Val() int64 }).Val(), c.Err(); err != nil || n != 1 {
			return false
		}
	}
	return true
}
