package scalesim

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/testlog"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var names = events.MustNames("sim")

// simConfig is one simulation's size.
type simConfig struct {
	entries, queues, replicas int
	// burst is the share of the entries that fire at second 0 of every
	// minute; the others fire once a minute at the second their number
	// gives, spread over the minute.
	burst float64
	// changes membership changes come every changeEvery, from
	// changeEvery after the start, cycling through a join, a kill, a join
	// and a clean stop; tail is the quiet time after the last one.
	changes     int
	changeEvery time.Duration
	tail        time.Duration
}

// The targets the simulation checks (issue 35).
const (
	maxShareRatio = 1.2 // attempts, reads and heap operations over their share
	maxSpread     = 1.3 // shards per replica, max over mean
)

// grace is the scheduler's catch-up grace: a tick older fires by catch-up
// policy (here: recorded as missed), so a takeover must come sooner.
const grace = scheduler.DefaultGrace

func configFromEnv(t *testing.T) simConfig {
	cfg := simConfig{entries: 5_000, queues: 8, replicas: 10, burst: 0.1, changes: 4, changeEvery: 10 * time.Second, tail: 25 * time.Second}
	env := func(name string, dst *int) {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				t.Fatalf("%s=%q: want a positive number", name, v)
			}
			*dst = n
		}
	}
	env("CRONSTREAM_SIM_ENTRIES", &cfg.entries)
	env("CRONSTREAM_SIM_REPLICAS", &cfg.replicas)
	env("CRONSTREAM_SIM_QUEUES", &cfg.queues)
	env("CRONSTREAM_SIM_CHANGES", &cfg.changes)
	return cfg
}

// TestSimulation runs cfg.replicas replicas over cfg.entries entries while
// replicas join, leave and are killed every 10 s of simulated time, and
// checks the targets: each replica's attempts and heap operations within
// 1.2 of its share of the work done while it was up, its watermark reads
// within 1.2 of the entries of the shards it took, the shards spread
// within 1.3 of the mean whenever ownership has settled, no tick fired
// twice or missed, and a killed replica's shards taken over within the
// catch-up grace. CRONSTREAM_SIM_ENTRIES (default 5,000),
// CRONSTREAM_SIM_REPLICAS (10), CRONSTREAM_SIM_QUEUES (8) and
// CRONSTREAM_SIM_CHANGES (4: a join, a kill, a join, a clean stop) size it.
func TestSimulation(t *testing.T) {
	cfg := configFromEnv(t)
	began := time.Now()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(-4*time.Second + 300*time.Millisecond)
	c := newCluster(t, cfg, start)
	built := time.Since(began)
	var heap memPeak
	heap.sample()
	t.Logf("%d entries in %d queues (%d%% at second 0), projection and Redis built in %s; heap in use %s",
		cfg.entries, cfg.queues, int(cfg.burst*100), built.Round(time.Millisecond), mib(heap.peak))

	for i := range cfg.replicas {
		c.start(fmt.Sprintf("r%02d", i))
		c.clock.Advance(53 * time.Millisecond) // replicas do not start in lockstep
		c.settle()
	}
	// The cold start: the first replica up takes every shard and hands
	// them over as the others come (HandoverSettle after each). Measures
	// count from when ownership has settled.
	coldStart := c.clock.Now()
	for !c.spread().settled {
		c.runUntil(c.clock.Now().Add(time.Second))
	}
	cold := c.measureAll()
	c.beginMeasures()
	heap.sample()
	t.Logf("cold start of %d replicas settled after %s: %s", cfg.replicas, c.clock.Now().Sub(coldStart), coldSummary(cold))
	next := cfg.replicas
	var kills []kill
	var spreads []spread
	at := c.clock.Now()
	for i := range cfg.changes {
		at = at.Add(cfg.changeEvery)
		c.runUntil(at.Add(-100 * time.Millisecond))
		spreads = append(spreads, c.spread())
		heap.sample()
		up := c.upReplicas()
		switch i % 4 {
		case 0, 2:
			c.runUntil(at)
			c.start(fmt.Sprintf("r%02d", next))
			next++
		case 1:
			victim := up[(i*7)%len(up)]
			c.runUntil(at)
			kills = append(kills, kill{id: victim.id, at: c.clock.Now(), shards: c.heldBy(victim.id)})
			c.kill(victim)
		case 3:
			c.runUntil(at)
			c.stop(up[(i*5)%len(up)])
		}
		t.Logf("%s: %s", []string{"join", "kill", "join", "stop"}[i%4], c)
	}
	end := at.Add(cfg.tail)
	c.runUntil(end)
	spreads = append(spreads, c.spread())
	heap.sample()
	ran := time.Since(began)
	final := c.measureAll()
	for _, r := range c.upReplicas() {
		c.stop(r)
	}

	rep := c.check(end, kills)
	simulated := end.Sub(start)
	t.Logf("simulated %s in %s (%.1f× real time); heap in use at most %s (%s per entry)",
		simulated.Round(time.Second), ran.Round(time.Millisecond), simulated.Seconds()/ran.Seconds(), mib(heap.peak),
		bytesPer(heap.peak, cfg.entries))
	t.Logf("%s", rep)
	t.Logf("per replica:\n%s", c.table(final))
	for _, s := range spreads {
		t.Logf("spread %s", s)
	}

	checkTargets(t, c, cfg, rep, spreads, final)
}

// checkTargets checks the report, the shares and the spreads against
// the targets.
func checkTargets(t *testing.T, c *cluster, cfg simConfig, rep report, spreads []spread, final map[string]work) {
	if rep.faults > 0 {
		t.Errorf("%d calls or fires the simulation does not model: %s", rep.faults, strings.Join(rep.faultList, "; "))
	}
	if rep.dup > 0 || rep.gap > 0 || rep.skipped > 0 || rep.behind > 0 {
		t.Errorf("ticks fired twice %d, out of order %d, recorded as missed %d, not fired by the end %d (%s)",
			rep.dup, rep.gap, rep.skipped, rep.behind, strings.Join(rep.examples, "; "))
	}
	if rep.unleased > 0 {
		t.Errorf("%d fire attempts on shards whose lease the attempting replica did not hold", rep.unleased)
	}
	for _, k := range rep.kills {
		if k.took > grace || k.untaken > 0 {
			t.Errorf("kill of %s: its %d shards taken over in %s (%d never), want within the catch-up grace %s", k.id, len(k.shards), k.took, k.untaken, grace)
		}
	}
	checkShares(t, c, final)
	settled := 0
	for _, s := range spreads {
		if !s.settled {
			continue
		}
		settled++
		if s.ratio() > maxSpread || s.unowned > 0 {
			t.Errorf("shard spread %s: want max/mean ≤ %.1f and every shard owned", s, maxSpread)
		}
	}
	if !spreads[len(spreads)-1].settled {
		t.Errorf("ownership had not settled %s after the last change: %s", cfg.tail, spreads[len(spreads)-1])
	}
	t.Logf("%d of %d spread samples taken with ownership settled", settled, len(spreads))
}

// newCluster builds the shared projection and Redis: every entry
// registered, its watermark at its last tick before start (a deployment
// already running).
func newCluster(t *testing.T, cfg simConfig, start time.Time) *cluster {
	m := clock.NewManual(start)
	fold := projector.NewFold(names)
	redis := newFakeRedis(names, m.Now)
	specs := map[string]*schedule.Schedule{}
	at := start.Add(-time.Hour)
	for i := range cfg.entries {
		e := simEntry(i, cfg)
		data := eventtest.MarshalAt(t, events.NewEventID(), at, events.TypeEntryRegistered, "sim", e.ID, e)
		if _, _, err := fold.Apply(names.ConfigSubject(e.ID), uint64(i+1), at, data); err != nil {
			t.Fatalf("entry %s: %v", e.ID, err)
		}
		s := specs[e.Cron]
		if s == nil {
			var err error
			if s, err = schedule.NewSchedule(e); err != nil {
				t.Fatal(err)
			}
			specs[e.Cron] = s
		}
		redis.seed(e.Options.Queue, e.ID, lastTick(s, start), s)
	}
	proj, err := projector.FromFold(names, fold)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("CRONSTREAM_SIM_LOG") != "" {
		log = testlog.Logger(t, slog.LevelInfo)
	}
	c := &cluster{tb: t, clock: m, redis: redis, proj: proj, names: names, log: log, share: map[string]*work{}}
	t.Cleanup(func() { _ = proj.Stop(t.Context()) })
	return c
}

// simEntry is entry i: once a minute, at second 0 for the burst's share,
// else at the second its number gives; a task of ordinary size.
func simEntry(i int, cfg simConfig) events.Entry {
	sec := i % 60
	if float64(i%1000) < cfg.burst*1000 {
		sec = 0
	}
	return events.Entry{
		ID:      fmt.Sprintf("e%07d", i),
		Cron:    fmt.Sprintf("%d * * * * *", sec),
		Task:    events.Task{Type: "report:generate", Payload: []byte(fmt.Sprintf(`{"account":%d,"kind":"daily"}`, i))},
		Options: events.Options{Queue: fmt.Sprintf("q%d", i%cfg.queues)},
	}
}

// lastTick is s's last tick at or before t.
func lastTick(s *schedule.Schedule, t time.Time) time.Time {
	last := s.Next(t.Add(-2 * time.Minute))
	for n := s.Next(last); !n.After(t); n = s.Next(n) {
		last = n
	}
	return last
}

// memPeak is the most heap in use seen.
type memPeak struct{ peak uint64 }

func (m *memPeak) sample() {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.peak = max(m.peak, ms.HeapInuse)
}

func mib(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func bytesPer(b uint64, n int) string { return fmt.Sprintf("%.0f B", float64(b)/float64(max(n, 1))) }

// kill is one replica killed, and the shards it held.
type kill struct {
	id     string
	at     time.Time
	shards []events.Shard
	// took is how long until the last of its shards was taken by
	// another replica; untaken counts those never taken.
	took    time.Duration
	untaken int
}

// heldBy lists the shards id holds a lease of now.
func (c *cluster) heldBy(id string) []events.Shard {
	var out []events.Shard
	for _, q := range c.proj.Queues() {
		for i := range events.ShardsPerQueue {
			if s := (events.Shard{Queue: q, Index: i}); c.redis.holder(s) == id {
				out = append(out, s)
			}
		}
	}
	return out
}

// spread is the shards per replica at one moment.
type spread struct {
	at       time.Time
	holders  map[string]int
	unowned  int
	settled  bool // every up replica held what its view wants it to
	min, max int
	mean     float64
}

func (s spread) ratio() float64 { return float64(s.max) / s.mean }

func (s spread) String() string {
	state := "settling"
	if s.settled {
		state = "settled"
	}
	return fmt.Sprintf("at %s (%s): %d replicas, shards per replica %d..%d, mean %.1f, max/mean %.3f, unowned %d",
		s.at.Format("15:04:05.0"), state, len(s.holders), s.min, s.max, s.mean, s.ratio(), s.unowned)
}

// spread takes the shards per up replica from the leases in Redis.
func (c *cluster) spread() spread {
	s := spread{at: c.clock.Now(), holders: c.holders(), settled: true}
	total := 0
	s.min = -1
	for _, n := range s.holders {
		total += n
		s.max = max(s.max, n)
		if s.min < 0 || n < s.min {
			s.min = n
		}
	}
	s.unowned = len(c.proj.Queues())*events.ShardsPerQueue - total
	s.mean = float64(total) / float64(max(len(s.holders), 1))
	for _, r := range c.upReplicas() {
		if rep := r.own.Report(); rep.Owned != rep.Desired || rep.Owned != s.holders[r.id] {
			s.settled = false
		}
	}
	return s
}

// report is what the checks found.
type report struct {
	entries                     int
	fired                       int64
	dup, gap, skipped, behind   int
	examples                    []string
	unleased                    uint64
	faults                      int
	faultList                   []string
	kills                       []kill
	takes, takeovers, handovers int
}

func (r report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d entries, %d ticks fired; fired twice %d, out of order %d, recorded as missed %d, not fired by the end %d; unleased attempts %d; unmodelled calls %d\n",
		r.entries, r.fired, r.dup, r.gap, r.skipped, r.behind, r.unleased, r.faults)
	fmt.Fprintf(&b, "lease acquisitions %d (takeovers of a lapsed lease %d, handovers %d)", r.takes, r.takeovers, r.handovers)
	for _, k := range r.kills {
		fmt.Fprintf(&b, "\nkill of %s at %s: its %d shards taken over within %s", k.id, k.at.Format("15:04:05.0"), len(k.shards), k.took)
	}
	return b.String()
}

// check reads the ledger: every tick due by end less a second fired once,
// in order, none recorded as missed; and when each killed replica's shards
// were taken.
func (c *cluster) check(end time.Time, kills []kill) report {
	r := c.redis
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := report{entries: len(r.book), faults: r.nfault, faultList: r.faults}
	due := end.Add(-time.Second)
	ids := slices.Sorted(maps.Keys(r.book))
	example := func(format string, args ...any) {
		if len(rep.examples) < 10 {
			rep.examples = append(rep.examples, fmt.Sprintf(format, args...))
		}
	}
	for _, id := range ids {
		b := r.book[id]
		rep.fired += int64(b.fired)
		rep.dup += int(b.dup)
		rep.gap += int(b.gap)
		rep.skipped += int(b.skipped)
		if b.dup+b.gap+b.skipped > 0 {
			example("%s: twice %d, out of order %d, missed %d", id, b.dup, b.gap, b.skipped)
		}
		q := c.queueOf(id)
		if wm := r.wm[slotEntry{q, id}]; !r.sched[id].Next(wm).After(due) {
			rep.behind++
			example("%s: watermark %s, a tick due by %s not fired", id, wm.Format("15:04:05"), due.Format("15:04:05"))
		}
	}
	for _, rp := range c.replicas {
		rep.unleased += rp.broker.unleased.Load()
	}
	for _, tk := range r.takes {
		rep.takes++
		switch {
		case tk.from == "":
		case c.killedID(tk.from):
			rep.takeovers++
		default:
			rep.handovers++
		}
	}
	for _, k := range kills {
		for _, s := range k.shards {
			taken := false
			for _, tk := range r.takes {
				if tk.shard == s && tk.from == k.id && !tk.at.Before(k.at) {
					k.took = max(k.took, tk.at.Sub(k.at))
					taken = true
					break
				}
			}
			if !taken {
				k.untaken++
			}
		}
		rep.kills = append(rep.kills, k)
	}
	return rep
}

// queueOf is entry id's queue (simEntry's rule).
func (c *cluster) queueOf(id string) string {
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "e"))
	return fmt.Sprintf("q%d", n%len(c.proj.Queues()))
}

func (c *cluster) killedID(id string) bool {
	for _, r := range c.replicas {
		if r.id == id {
			return r.killed
		}
	}
	return false
}

// moved counts, per replica, the entries of the shards it took since the
// measures began, and those of the shards it let go while running.
func (c *cluster) moved() (taken, given map[string]float64) {
	r := c.redis
	r.mu.Lock()
	defer r.mu.Unlock()
	taken, given = map[string]float64{}, map[string]float64{}
	for _, tk := range r.takes {
		if !tk.at.After(c.from) {
			continue // its reads were made before the measures began
		}
		n := float64(r.shardSize[tk.shard])
		taken[tk.holder] += n
		if from := c.byID(tk.from); from != nil && (from.up() || from.stopped.After(tk.at)) {
			given[tk.from] += n
		}
	}
	return taken, given
}

func (c *cluster) byID(id string) *replica {
	for _, r := range c.replicas {
		if r.id == id {
			return r
		}
	}
	return nil
}

// coldSummary says what the cold start cost each replica.
func coldSummary(cold map[string]work) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(cold)) {
		w := cold[id]
		parts = append(parts, fmt.Sprintf("%s %.0f reads %.0f attempts", id, w.reads, w.attempts))
	}
	return strings.Join(parts, ", ")
}

// checkShares checks each replica's work since the measures began
// against its share, the part of each step's work (fires, reads, heap
// operations) that falls to it among the replicas up then:
//
//   - Attempts within 1.2 of that share, for every replica whose share of
//     the fires is at least 1% of them (one up for a few seconds owns
//     nothing for the handover settle).
//   - Watermark reads and heap operations within 1.2 of that share for the
//     replicas up through the whole measured time. A replica that joined
//     reads the watermarks of its shards and puts their entries in its
//     heap once, at the handover: with entries firing once a minute, that
//     is as much work as a minute of its fires, so its reads and heap
//     operations stay above a share counted from its join until it has
//     been up for minutes. For every replica, then, its own work: reads
//     within 1.2 of the entries of the shards it took (each read once,
//     when taken, and no other entry ever), heap operations within 1.2 of
//     two per attempt (the pop and the next tick's push) plus one per
//     entry taken or let go (nothing for other replicas' entries).
func checkShares(t *testing.T, c *cluster, final map[string]work) {
	taken, given := c.moved()
	var total work
	for _, w := range final {
		total.attempts += w.attempts
	}
	var worst struct{ attempts, heapShare, readShare, heapOwn, readOwn float64 }
	check := func(r *replica, what string, got, want float64, worst *float64) {
		if want <= 0 {
			return
		}
		ratio := got / want
		*worst = max(*worst, ratio)
		if ratio > maxShareRatio {
			t.Errorf("%s: %.0f %s, %.2f× %.0f", r.id, got, what, ratio, want)
		}
	}
	for _, r := range c.replicas {
		w, s := final[r.id], c.share[r.id]
		if s.attempts >= total.attempts/100 {
			check(r, "fire attempts to its share", w.attempts, s.attempts, &worst.attempts)
		}
		if !r.started.After(c.from) && (r.up() || !r.stopped.Before(c.clock.Now())) {
			check(r, "heap operations to its share", w.heapOps, s.heapOps, &worst.heapShare)
			check(r, "watermark reads to its share", w.reads, s.reads, &worst.readShare)
		}
		check(r, "heap operations to its own fires and moves", w.heapOps, 2*w.attempts+taken[r.id]+given[r.id], &worst.heapOwn)
		check(r, "watermark reads to the entries of the shards it took", w.reads, taken[r.id], &worst.readOwn)
		if taken[r.id] == 0 && w.reads > 0 {
			t.Errorf("%s: %.0f watermark reads without taking a shard", r.id, w.reads)
		}
	}
	t.Logf("worst ratios: attempts to share %.3f; replicas up throughout: heap operations to share %.3f, reads to share %.3f; "+
		"every replica: heap operations to its own fires and moves %.3f, reads to the entries it took %.3f",
		worst.attempts, worst.heapShare, worst.readShare, worst.heapOwn, worst.readOwn)
}

// table lists each replica's work, share and moves since the measures
// began.
func (c *cluster) table(final map[string]work) string {
	taken, given := c.moved()
	var b strings.Builder
	fmt.Fprintf(&b, "  %-4s %-8s %10s %10s %6s %10s %10s %6s %9s %9s %9s\n",
		"id", "state", "attempts", "share", "ratio", "heap ops", "share", "ratio", "reads", "taken", "let go")
	for _, r := range c.replicas {
		w, s := final[r.id], c.share[r.id]
		state := "up"
		switch {
		case r.killed:
			state = "killed"
		case !r.stopped.IsZero() && r.stopped.Before(c.clock.Now()):
			state = "stopped"
		}
		fmt.Fprintf(&b, "  %-4s %-8s %10.0f %10.0f %6.3f %10.0f %10.0f %6.3f %9.0f %9.0f %9.0f\n", r.id, state,
			w.attempts, s.attempts, ratio(w.attempts, s.attempts), w.heapOps, s.heapOps, ratio(w.heapOps, s.heapOps),
			w.reads, taken[r.id], given[r.id])
	}
	return b.String()
}

func ratio(a, b float64) float64 { return a / cmp.Or(b, 1) }
