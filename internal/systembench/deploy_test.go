package systembench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// The deployments of the scale benchmarks (BenchmarkScaleOut,
// BenchmarkOverload, BenchmarkSustained/replicas=3vs1) and their measured
// window. They observe only what every build of cronstream shares (task ids,
// task hashes, pending lists, the activity stream, /readyz, process CPU), so
// the same benchmark measures the build on main, where every replica fires
// every entry, and a build where replicas divide the entries.

// scope is a testing.TB whose cleanups run when close is called instead of
// at the end of the benchmark, so that one benchmark run can set up and
// tear down many deployments (a capacity search runs one per probe).
// Everything else goes to the benchmark. close also runs at the benchmark's
// cleanup, for a deployment a failure left standing.
type scope struct {
	testing.TB

	mu       sync.Mutex
	cleanups []func()
}

func newScope(tb testing.TB) *scope {
	sc := &scope{TB: tb}
	tb.Cleanup(sc.close)
	return sc
}

func (sc *scope) Cleanup(f func()) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.cleanups = append(sc.cleanups, f)
}

func (sc *scope) TempDir() string {
	sc.Helper()
	dir, err := os.MkdirTemp("", "cronstream-systembench-")
	if err != nil {
		sc.Fatal(err)
	}
	sc.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// close runs the cleanups registered so far, the last first.
func (sc *scope) close() {
	for {
		sc.mu.Lock()
		if len(sc.cleanups) == 0 {
			sc.mu.Unlock()
			return
		}
		f := sc.cleanups[len(sc.cleanups)-1]
		sc.cleanups = sc.cleanups[:len(sc.cleanups)-1]
		sc.mu.Unlock()
		f()
	}
}

// deployConfig is one deployment: entries `@every 1s` spread round-robin
// over queues, and replicas `cronstream run` processes.
type deployConfig struct {
	entries  int
	queues   int
	replicas int
	// cores is the share of a core each replica's CPU group allows; 0 runs
	// the replicas without a group.
	cores float64
	// gomaxprocs is the replicas' GOMAXPROCS; 0 leaves Go's default.
	gomaxprocs int
	// warmup is how long the deployment fires, after every replica is
	// ready and one tick of every entry has fired, before a window starts.
	warmup time.Duration
}

const (
	// readyTimeout bounds the wait for every replica's /readyz.
	readyTimeout = 5 * time.Minute
	// firstTickTimeout bounds the wait, once every replica is ready, for as
	// many fires as there are entries: a deployment that cannot fire one
	// tick of every entry in that time is far past its capacity, and the
	// window is measured anyway (an overload run wants it).
	firstTickTimeout = 2 * time.Minute
	// settleTimeout bounds the wait for the event backlog to drain after
	// the first tick (deployment.settle).
	settleTimeout = 2 * time.Minute
	// readGrace is how long after a window's end its ticks are read back
	// from Redis: a tick fired later than that counts as missed. It is
	// the catch-up grace (scheduler.DefaultGrace), after which a replica
	// records a tick as skipped rather than firing it late.
	readGrace = 5 * time.Second
	// serverCoreLimit is the most of a core redis-server or nats-server may
	// use in a window that measures cronstream: above it the window
	// measures the machine, and is void.
	serverCoreLimit = 0.7
)

// deployment is one deployment of deployConfig on this machine: a
// nats-server process, a private redis-server and the replica processes,
// all torn down by close.
type deployment struct {
	sc     *scope
	s      *system
	cfg    deployConfig
	queues []string
	ids    []string // entry i fires into queues[i%len(queues)]
	ps     []*replicaProc
	groups []*testenv.CPUGroup
	// warmErr says why the warm-up did not complete ("" when it did).
	warmErr string
}

func scaleQueue(i int) string { return fmt.Sprintf("q%d", i) }

// deploy sets up cfg, waits until every replica is ready and the warm-up
// is over, and returns the deployment. It fails the benchmark on what the
// harness cannot go on from (a replica that exits, one never ready).
func deploy(tb testing.TB, cfg deployConfig) *deployment {
	tb.Helper()
	sc := newScope(tb)
	d := &deployment{sc: sc, s: newSystemWith(sc, systemConfig{natsProcess: true}), cfg: cfg}
	for q := range max(cfg.queues, 1) {
		d.queues = append(d.queues, scaleQueue(q))
	}
	es := entries("e", "@every 1s", cfg.entries)
	for i := range es {
		es[i].Options.Queue = d.queues[i%len(d.queues)]
		d.ids = append(d.ids, es[i].ID)
	}
	d.s.register(es)
	for i := range cfg.replicas {
		rc := replicaConfig{}
		if cfg.gomaxprocs > 0 {
			rc.env = append(rc.env, "GOMAXPROCS="+strconv.Itoa(cfg.gomaxprocs))
		}
		if cfg.cores > 0 {
			g, err := testenv.NewCPUGroup(sc, fmt.Sprintf("r%d", i), cfg.cores)
			if err != nil {
				sc.Fatal(err)
			}
			rc.group = g
			d.groups = append(d.groups, g)
		}
		d.ps = append(d.ps, d.s.startReplicaWith(fmt.Sprintf("r%d", i), rc))
	}
	d.waitReady()
	base := d.s.pendingAll(d.queues)
	var fired int64
	if !testenv.WaitFor(firstTickTimeout, func() bool {
		d.checkAlive()
		fired = d.s.pendingAll(d.queues) - base
		return fired >= int64(cfg.entries)
	}) {
		d.warmErr = fmt.Sprintf("%d fires within %s of readiness, fewer than the %d of one tick of every entry", fired, firstTickTimeout, cfg.entries)
	}
	d.settle()
	waitUntil(time.Now().Add(cfg.warmup))
	return d
}

// settle waits, for at most settleTimeout, until the deployment is in its
// steady state: over the last two seconds it wrote no more tasks than the
// entries' ticks (it is not catching up on late ones), and the backlog of
// fires without an event is below a second's fires. Replicas that start
// one after another hand shards and queue duties over as each becomes
// ready, and the ticks and events held meanwhile are caught up after: a
// window that starts before they are would charge that start-up to the
// steady state it measures. A deployment past its capacity never settles;
// its window is measured anyway, and its lag and backlog say so.
func (d *deployment) settle() {
	const span = 2 * time.Second
	deadline := time.Now().Add(settleTimeout)
	prev := d.s.pendingAll(d.queues)
	for time.Now().Before(deadline) {
		time.Sleep(span)
		d.checkAlive()
		cur := d.s.pendingAll(d.queues)
		written := float64(cur-prev) / span.Seconds()
		prev = cur
		if written <= 1.02*float64(d.cfg.entries) && written >= 0.98*float64(d.cfg.entries) && d.s.eventBacklog(d.queues...) < int64(d.cfg.entries) {
			return
		}
	}
}

func (d *deployment) close() { d.sc.close() }

// checkAlive fails the benchmark when a replica has exited.
func (d *deployment) checkAlive() {
	for _, p := range d.ps {
		if p.exited() {
			d.sc.Fatalf("replica %s exited: %v; log:\n%s", p.id, p.err, p.logTail())
		}
	}
}

// waitReady waits until every replica answers /readyz with 200: the
// readiness every build reports, whatever its replicas hold.
func (d *deployment) waitReady() {
	d.sc.Helper()
	for _, p := range d.ps {
		testenv.Eventually(d.sc, readyTimeout, func() bool {
			d.checkAlive()
			code, _, err := p.get("/readyz")
			return err == nil && code == 200
		}, "replica %s ready", p.id)
	}
}

// usage is what the deployment has used and done at one instant.
type usage struct {
	at        time.Time
	replicas  []time.Duration // CPU of each replica process
	throttled []time.Duration // time each replica's CPU group was throttled
	redis     time.Duration
	nats      time.Duration
	harness   time.Duration // this process: the benchmark's own sampling
	machine   time.Duration // the whole machine's busy CPU
	steal     time.Duration // CPU the hypervisor took from the machine
	fires     int64         // tasks in the queues' pending lists
	// redisCalls and jsAPI are the servers' requests (serverRequests).
	redisCalls map[string]int64
	jsAPI      uint64
	attempts   attempts
}

func (d *deployment) usage() usage {
	// The clocks first, together; the slower reads (Redis, /metrics) after.
	u := usage{at: time.Now(), redis: testenv.ProcCPU(d.s.redisPID), nats: testenv.ProcCPU(d.s.natsPID()), harness: testenv.SelfCPU()}
	u.machine, u.steal = testenv.MachineCPU()
	for _, p := range d.ps {
		u.replicas = append(u.replicas, testenv.ProcCPU(p.pid()))
	}
	for _, g := range d.groups {
		st, _ := g.Stat()
		u.throttled = append(u.throttled, st.Throttled)
	}
	u.fires = d.s.pendingAll(d.queues)
	u.attempts = fireAttempts(d.ps)
	u.redisCalls, u.jsAPI = d.s.serverRequests()
	return u
}

// window is what a deployment did over a measured window of whole seconds.
type window struct {
	cfg     deployConfig
	secs    int
	warmErr string
	wall    time.Duration
	// fires is the tasks fired during the window, whatever their tick:
	// what the CPU of the window was spent on.
	fires int64
	// ticks is entries × seconds of the window; missed is those of them
	// with no task readGrace after the window's end; lags are the fired
	// ones' enqueue time (the task's pending_since, Redis time) minus
	// their tick.
	ticks, missed          int
	lagP50, lagP99, lagMax time.Duration
	// backlogMax and backlogSlope are the fires without an event in the
	// activity stream: the largest sample, and the least-squares slope
	// over the window (fires per second). The deployment is warm, so the
	// whole window counts: the longer the window, the smaller the drift
	// the slope tells from the relay's swing within each second (a window
	// of a few seconds tells none).
	backlogMax   int64
	backlogSlope float64
	replicas     []time.Duration // CPU of each replica
	throttled    []time.Duration // of each replica's CPU group (cpu.stat: summed over the CPUs)
	redis, nats  time.Duration
	harness      time.Duration
	// machine and steal are the whole machine's busy CPU and the CPU the
	// hypervisor stole from it (testenv.MachineCPU): what every process
	// together, the benchmark's and any other, left of the cores.
	machine, steal time.Duration
	// redisCalls is Redis's calls per command over the window, jsAPI the
	// JetStream API calls (system.serverRequests).
	redisCalls map[string]int64
	jsAPI      uint64
	attempts   attempts
	late       float64 // cronstream_late_entries summed over the replicas at the end
	// shown is cronstream_fire_capacity summed over the replicas at the
	// end: what they have shown they can fire (0: unknown, or a build
	// without it).
	shown float64
	// shards and duties are each replica's cronstream_shards_owned and
	// cronstream_queue_duties at the end: a replica busier than the
	// others shows whether it owns more entries or relays more queues.
	shards, duties []float64
	// takeovers and lost are each replica's shard takeovers and leases
	// lost since its start: shards that changed hands other than by a
	// planned handover.
	takeovers, lost []float64
}

// measure runs a window of secs whole seconds (its edges between two
// seconds' bursts of fires), then reads the window's ticks back from
// Redis.
func (d *deployment) measure(secs int) window {
	d.sc.Helper()
	from := nextSecond(700 * time.Millisecond)
	to := from.Add(time.Duration(secs) * time.Second)
	waitUntil(from)
	stopSampling := d.s.sampleBacklog(250*time.Millisecond, d.queues...)
	u0 := d.usage()
	waitUntil(to)
	u1 := d.usage()
	samples := stopSampling()
	d.checkAlive()
	w := window{cfg: d.cfg, secs: secs, warmErr: d.warmErr, wall: u1.at.Sub(u0.at), fires: u1.fires - u0.fires,
		redis: u1.redis - u0.redis, nats: u1.nats - u0.nats, harness: u1.harness - u0.harness,
		machine: u1.machine - u0.machine, steal: u1.steal - u0.steal, jsAPI: u1.jsAPI - u0.jsAPI,
		redisCalls: map[string]int64{},
		attempts:   u1.attempts.sub(u0.attempts)}
	for i := range u1.replicas {
		w.replicas = append(w.replicas, u1.replicas[i]-u0.replicas[i])
	}
	for i := range u1.throttled {
		w.throttled = append(w.throttled, u1.throttled[i]-u0.throttled[i])
	}
	for cmd, n := range u1.redisCalls {
		w.redisCalls[cmd] = n - u0.redisCalls[cmd]
	}
	for _, p := range d.ps {
		v, _ := p.metric("cronstream_late_entries")
		w.late += v
		c, _ := p.metric("cronstream_fire_capacity")
		w.shown += c
		o, _ := p.metric("cronstream_shards_owned")
		q, _ := p.metric("cronstream_queue_duties")
		w.shards, w.duties = append(w.shards, o), append(w.duties, q)
		t, _ := p.metric("cronstream_shard_takeovers_total")
		l, _ := p.metric("cronstream_shard_leases_lost_total")
		w.takeovers, w.lost = append(w.takeovers, t), append(w.lost, l)
	}
	w.backlogMax, _ = backlogTrend(samples)
	w.backlogSlope = backlogSlope(samples)
	waitUntil(to.Add(readGrace))
	d.readTicks(&w, from, to)
	return w
}

// readTicks reads each tick of the window (every entry, every whole second
// in (from, to)) from Redis: its task's pending_since, or none (missed).
func (d *deployment) readTicks(w *window, from, to time.Time) {
	d.sc.Helper()
	ctx := context.Background()
	prefix := d.s.names.Prefix()
	var lags []time.Duration
	type tick struct {
		at  time.Time
		key string
	}
	const chunk = 8192
	batch := make([]tick, 0, chunk)
	flush := func() {
		pipe := d.s.rc.Pipeline()
		cmds := make([]*redis.StringCmd, len(batch))
		for i, t := range batch {
			cmds[i] = pipe.HGet(ctx, t.key, "pending_since")
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			d.sc.Fatal(err)
		}
		for i, c := range cmds {
			ns, err := strconv.ParseInt(c.Val(), 10, 64)
			if err != nil {
				w.missed++
				continue
			}
			lags = append(lags, time.Unix(0, ns).Sub(batch[i].at))
		}
		batch = batch[:0]
	}
	for sec := from.Unix() + 1; sec <= to.Unix(); sec++ {
		at := time.Unix(sec, 0).UTC()
		for i, id := range d.ids {
			q := d.queues[i%len(d.queues)]
			batch = append(batch, tick{at: at, key: taskstate.Keys(q).Task(events.TaskID(prefix, id, at))})
			if len(batch) == chunk {
				flush()
			}
		}
		w.ticks += len(d.ids)
	}
	if len(batch) > 0 {
		flush()
	}
	if w.missed == w.ticks && w.fires > 0 {
		d.sc.Fatalf("%d tasks fired in the window, but none under the task ids of its ticks (%s): the harness reads the wrong keys",
			w.fires, taskstate.Keys(d.queues[0]).Task(events.TaskID(prefix, d.ids[0], from.Truncate(time.Second).Add(time.Second))))
	}
	w.lagP50, w.lagP99, w.lagMax = percentile(lags, 0.5), percentile(lags, 0.99), percentile(lags, 1)
}

func (w window) cores(d time.Duration) float64 {
	if w.wall <= 0 {
		return 0
	}
	return d.Seconds() / w.wall.Seconds()
}

// firesPerSec is the ticks of the window that fired, a second: what the
// deployment keeps up with. A deployment behind fires ticks from before
// the window during it and ticks of its end after it; counting the
// window's ticks, not the tasks written during it, leaves out the first
// and counts the second, which a short window would otherwise see as
// more fires a second than the deployment can keep.
func (w window) firesPerSec() float64 { return float64(w.ticks-w.missed) / float64(w.secs) }

// tasksPerSec is the tasks written during the window, a second, whatever
// their tick.
func (w window) tasksPerSec() float64 { return float64(w.fires) / w.wall.Seconds() }

func (w window) replicaCPU() time.Duration {
	var sum time.Duration
	for _, c := range w.replicas {
		sum += c
	}
	return sum
}

// perFire is d in µs per fire of the window.
func (w window) perFire(d time.Duration) float64 { return usPer(d, int(w.fires)) }

// maxLag is the fire lag p99 a held window may have.
const maxLag = time.Second

// heldReasons says why the window did not hold its entries: ticks missed,
// lag p99 over 1 s, or a backlog of events that grows by more than one
// second's fires a minute. Empty when it held them.
func (w window) heldReasons() []string {
	var why []string
	if w.warmErr != "" {
		why = append(why, "warm-up: "+w.warmErr)
	}
	if w.missed > 0 {
		why = append(why, fmt.Sprintf("%d of %d ticks missed", w.missed, w.ticks))
	}
	if w.lagP99 > maxLag {
		why = append(why, fmt.Sprintf("lag p99 %s over %s", w.lagP99.Round(time.Millisecond), maxLag))
	}
	if bound := float64(w.cfg.entries) / 60; w.backlogSlope > bound {
		why = append(why, fmt.Sprintf("event backlog growing %+.0f fires/s (bound %.0f: a second's fires a minute)", w.backlogSlope, bound))
	}
	return why
}

func (w window) held() bool { return len(w.heldReasons()) == 0 }

// voidReason says why the window measured the machine rather than
// cronstream: redis-server or nats-server over serverCoreLimit of a core.
// Empty when it did not.
func (w window) voidReason() string {
	var why []string
	if c := w.cores(w.redis); c > serverCoreLimit {
		why = append(why, fmt.Sprintf("redis-server used %.2f of a core", c))
	}
	if c := w.cores(w.nats); c > serverCoreLimit {
		why = append(why, fmt.Sprintf("nats-server used %.2f of a core", c))
	}
	if len(why) == 0 {
		return ""
	}
	return strings.Join(why, ", ") + fmt.Sprintf(" (over %.2f)", serverCoreLimit)
}

// String is one line for the benchmark's log.
func (w window) String() string {
	var cores []string
	for i, c := range w.replicas {
		s := fmt.Sprintf("%.3f", w.cores(c))
		if i < len(w.throttled) {
			s += fmt.Sprintf(" (throttled %.2f s)", w.throttled[i].Seconds())
		}
		if i < len(w.shards) {
			s += fmt.Sprintf(" [%.0f shards, %.0f queues' duties; %.0f taken over, %.0f leases lost]", w.shards[i], w.duties[i], w.takeovers[i], w.lost[i])
		}
		cores = append(cores, s)
	}
	return fmt.Sprintf("%d entries over %d queues, %d replica(s), %d s: %.0f ticks fired a second (%.0f tasks written a second); lag p50 %s p99 %s max %s; %d of %d ticks missed; "+
		"event backlog largest %d, slope %+.1f fires/s; cores: replicas %s, redis-server %.3f, nats-server %.3f, harness %.3f, machine %.2f of %d busy, %.2f stolen; "+
		"%.2f fire attempts per fire (%.0f refused, %.0f skipped records); %.0f late entries at the end; per fire: %s",
		w.cfg.entries, w.cfg.queues, w.cfg.replicas, w.secs, w.firesPerSec(), w.tasksPerSec(),
		w.lagP50.Round(time.Millisecond), w.lagP99.Round(time.Millisecond), w.lagMax.Round(time.Millisecond), w.missed, w.ticks,
		w.backlogMax, w.backlogSlope, strings.Join(cores, ", "), w.cores(w.redis), w.cores(w.nats), w.cores(w.harness),
		w.cores(w.machine), runtime.NumCPU(), w.cores(w.steal),
		(w.attempts.fired+w.attempts.refused)/max(w.attempts.fired, 1), w.attempts.refused, w.attempts.skipped, w.late, w.requestsPerFire())
}

// requestsPerFire is the servers' requests over the window per task
// fired: Redis's calls in all and of its busiest commands, and the
// JetStream API calls.
func (w window) requestsPerFire() string {
	fires := float64(max(w.fires, 1))
	var total int64
	type call struct {
		cmd string
		n   int64
	}
	var calls []call
	for cmd, n := range w.redisCalls {
		total += n
		calls = append(calls, call{cmd, n})
	}
	slices.SortFunc(calls, func(a, b call) int { return cmp.Compare(b.n, a.n) })
	var top []string
	for _, c := range calls[:min(len(calls), 5)] {
		top = append(top, fmt.Sprintf("%s %.3f", c.cmd, float64(c.n)/fires))
	}
	return fmt.Sprintf("Redis calls %.3f (%s), JetStream API calls %.4f", float64(total)/fires, strings.Join(top, ", "), float64(w.jsAPI)/fires)
}
