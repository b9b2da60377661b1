package scheduler_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// Benchmarks of the whole firing path on this machine: one replica
// (projector, scheduler, relay, and the fire-subject subscription a replica
// runs) against a real redis-server and a nats-server, beside asynq's own
// Scheduler against a second redis-server.
//
//	go test -run '^$' -bench 'BenchmarkSteady|BenchmarkSameInstant' -benchtime 1x -timeout 30m ./scheduler/
//
// CRONSTREAM_BENCH_ENTRIES, CRONSTREAM_BENCH_SECONDS (steady) and
// CRONSTREAM_BENCH_INSTANT_ENTRIES (same instant) shrink them for quick runs.
//
// NATS runs as its own process (nats-server built from the module cache
// into a temporary directory) so its CPU is measured apart from ours; when
// that build fails the embedded server is used and its CPU is part of the
// process figure (the report says which).

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// natsServer is a nats-server for a benchmark: a separate process when one
// can be built, else the embedded test server.
type natsServer struct {
	url string
	pid int // 0: embedded, in this process
}

func startBenchNATS(b *testing.B) natsServer {
	b.Helper()
	bin, err := testenv.BuildNATSServer(b.TempDir())
	if err != nil {
		b.Logf("cannot build nats-server (%v); using the embedded server, whose CPU is then part of the process figure", err)
		return natsServer{url: testenv.StartNATS(b).URL()}
	}
	p := testenv.StartNATSProcess(b, bin)
	return natsServer{url: p.URL(), pid: p.PID()}
}

func benchConnect(b *testing.B, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	b.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	return nc, js
}

// benchReplica is one replica wired as in replica.Run, without membership
// or ownership (alone, it fires every entry).
type benchReplica struct {
	proj    *projector.Projector
	relay   *relay.Relay
	sched   *scheduler.Scheduler
	metrics *scheduler.Metrics
	stopped bool
}

func startBenchReplica(b *testing.B, url string, rc *redis.Client, clock *scheduler.Clock) *benchReplica {
	b.Helper()
	// As replica.Run connects: NoEcho, and the relay reports what it
	// published.
	_, js := benchConnect(b, url, nats.NoEcho())
	store := taskstate.New(rc)
	r := &benchReplica{}
	var err error
	if r.proj, err = projector.New(projector.Config{JS: js, Names: testNames, Logger: discardLogger}); err != nil {
		b.Fatal(err)
	}
	if err := r.proj.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	if r.relay, err = relay.New(relay.Config{Outbox: store, JS: js, Names: testNames, Owner: "bench", Logger: discardLogger,
		Hold: func() bool { return r.sched != nil && r.sched.Busy() }}); err != nil {
		b.Fatal(err)
	}
	r.metrics = scheduler.NewMetrics(nil)
	r.sched, err = scheduler.New(scheduler.Config{
		Metrics: r.metrics, Redis: rc, Projection: r.proj, Names: testNames, ReplicaID: "bench", Clock: clock,
		OutboxBytes: r.relay.BacklogBytes, MaxOutboxBytes: 1 << 30, OnFire: r.relay.Notify, Logger: discardLogger,
		History: scheduler.NewStreamHistory(js, testNames),
	})
	if err != nil {
		b.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := r.relay.Start(c); err != nil {
		b.Fatal(err)
	}
	if err := r.sched.Start(c); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.stop)
	return r
}

func (r *benchReplica) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = r.sched.Stop(c)
	_ = r.relay.Stop(c)
	_ = r.proj.Stop(c)
}

// pendingSince reads pending_since (unix ns) of the given tasks.
func pendingSince(b *testing.B, rc *redis.Client, queue string, ids []string) []time.Time {
	b.Helper()
	keys := taskstate.Keys(queue)
	out := make([]time.Time, 0, len(ids))
	for start := 0; start < len(ids); start += 2000 {
		pipe := rc.Pipeline()
		cmds := make([]*redis.StringCmd, 0, 2000)
		for _, id := range ids[start:min(start+2000, len(ids))] {
			cmds = append(cmds, pipe.HGet(context.Background(), keys.Task(id), "pending_since"))
		}
		if _, err := pipe.Exec(context.Background()); err != nil && err != redis.Nil {
			b.Fatal(err)
		}
		for _, c := range cmds {
			ns, err := strconv.ParseInt(c.Val(), 10, 64)
			if err != nil {
				out = append(out, time.Time{})
				continue
			}
			out = append(out, time.Unix(0, ns))
		}
	}
	return out
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(float64(len(d)-1) * p)
	return d[i]
}

// nextSecond waits for the next whole second of now and returns it.
func nextSecond(b *testing.B, now func() time.Time) time.Time {
	at := now().Truncate(time.Second).Add(time.Second)
	waitUntil(b, now, at)
	return at
}

// windowOffset places the measured window's ends between two bursts of
// fires (each second's fires and their events are done well within it, for
// both schedulers), so the window holds whole seconds of work: with ends
// inside a burst, the count of fires and the CPU they cost fall on
// different sides of the edge and the per-fire figure swings by ±10%.
const windowOffset = 700 * time.Millisecond

type cpuSample struct {
	self, redis, nats time.Duration
}

func sample(redisPID, natsPID int) cpuSample {
	return cpuSample{self: testenv.SelfCPU(), redis: testenv.ProcCPU(redisPID), nats: testenv.ProcCPU(natsPID)}
}

func (s cpuSample) sub(o cpuSample) cpuSample {
	return cpuSample{self: s.self - o.self, redis: s.redis - o.redis, nats: s.nats - o.nats}
}

func perFire(d time.Duration, fires int) float64 {
	if fires == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(fires)
}

// BenchmarkSteadyEvery1s: 10,000 entries "@every 1s" for 15 s, ours then
// asynq's Scheduler with the same entries, in one run. Reports CPU per fire
// (ours: process + redis-server, NATS apart; asynq: process + its
// redis-server) and the fire lag (enqueue time − scheduled second).
func BenchmarkSteadyEvery1s(b *testing.B) {
	n := envInt("CRONSTREAM_BENCH_ENTRIES", 10_000)
	secs := envInt("CRONSTREAM_BENCH_SECONDS", 15)
	for range b.N {
		ours := benchOurs(b, n, secs)
		if os.Getenv("CRONSTREAM_BENCH_ONLY_OURS") != "" {
			b.Logf("ours:  %d fires in %ds; CPU/fire %.1fµs = process %.1fµs + redis %.1fµs; NATS %.1fµs (%s); lag p50 %s p99 %s",
				ours.fires, secs, ours.cpu, ours.proc, ours.redis, ours.nats, ours.natsWhere, ours.p50, ours.p99)
			continue
		}
		theirs := benchAsynq(b, n, secs)
		b.ReportMetric(ours.cpu, "ours-cpu-us/fire")
		b.ReportMetric(ours.nats, "ours-nats-cpu-us/fire")
		b.ReportMetric(theirs.cpu, "asynq-cpu-us/fire")
		b.ReportMetric(ours.cpu/theirs.cpu, "ours/asynq")
		b.ReportMetric(float64(ours.p50.Milliseconds()), "ours-lag-p50-ms")
		b.ReportMetric(float64(ours.p99.Milliseconds()), "ours-lag-p99-ms")
		b.ReportMetric(float64(theirs.p50.Milliseconds()), "asynq-lag-p50-ms")
		b.ReportMetric(float64(theirs.p99.Milliseconds()), "asynq-lag-p99-ms")
		b.Logf("ours:  %d fires in %ds; CPU/fire %.1fµs = process %.1fµs + redis %.1fµs; NATS %.1fµs (%s); lag p50 %s p99 %s",
			ours.fires, secs, ours.cpu, ours.proc, ours.redis, ours.nats, ours.natsWhere, ours.p50, ours.p99)
		b.Logf("asynq: %d fires in %ds; CPU/fire %.1fµs = process %.1fµs + redis %.1fµs; lag p50 %s p99 %s",
			theirs.fires, secs, theirs.cpu, theirs.proc, theirs.redis, theirs.p50, theirs.p99)
	}
}

type steadyResult struct {
	fires                  int
	cpu, proc, redis, nats float64
	natsWhere              string
	p50, p99               time.Duration
}

func benchOurs(b *testing.B, n, secs int) steadyResult {
	srv := startBenchNATS(b)
	rd := testenv.StartRedis(b, testenv.WithPrivateServer())
	rc := rd.Client(b)
	_, js := benchConnect(b, srv.url)
	if err := events.EnsureStreams(context.Background(), js, events.StreamConfig{Names: testNames}); err != nil {
		b.Fatal(err)
	}
	eventtest.Register(b, js, testNames, "bench", entriesOf(n, func(i int) events.Entry { return every(fmt.Sprintf("s%05d", i), "@every 1s") }), 30*time.Second)
	r := startBenchReplica(b, srv.url, rc, nil)
	// Warm up: every entry loaded and firing.
	testenv.Eventually(b, 2*time.Minute, func() bool { return readCounts(r.metrics).Fired >= uint64(2*n) }, "warm-up fires")
	from := nextSecond(b, time.Now).Add(windowOffset)
	waitUntil(b, time.Now, from)
	firedBefore := readCounts(r.metrics).Fired
	before := sample(testenv.RedisPID(b, rc), srv.pid)
	waitUntil(b, time.Now, from.Add(time.Duration(secs)*time.Second))
	used := sample(testenv.RedisPID(b, rc), srv.pid).sub(before)
	fires := int(readCounts(r.metrics).Fired - firedBefore)
	r.stop()
	if os.Getenv("CRONSTREAM_BENCH_COMMANDSTATS") != "" {
		_ = os.WriteFile(os.Getenv("CRONSTREAM_BENCH_COMMANDSTATS"), []byte(rc.Info(context.Background(), "commandstats").Val()), 0o644)
	}

	// Lag of every tick in the window, from the tasks' pending_since.
	var ids []string
	var ticks []time.Time
	for s := from.Unix() + 1; s < from.Unix()+int64(secs); s++ {
		for i := range n {
			ids = append(ids, schedule.TaskID(testPrefix, fmt.Sprintf("s%05d", i), time.Unix(s, 0)))
			ticks = append(ticks, time.Unix(s, 0))
		}
	}
	var lags []time.Duration
	missing := 0
	for i, at := range pendingSince(b, rc, "default", ids) {
		if at.IsZero() {
			missing++
			continue
		}
		lags = append(lags, at.Sub(ticks[i]))
	}
	if missing > 0 {
		b.Errorf("%d of %d ticks in the window have no task", missing, len(ids))
	}
	where := "separate process"
	if srv.pid == 0 {
		where = "embedded: included in process"
	}
	return steadyResult{
		fires: fires,
		cpu:   perFire(used.self+used.redis, fires), proc: perFire(used.self, fires), redis: perFire(used.redis, fires),
		nats: perFire(used.nats, fires), natsWhere: where,
		p50: percentile(lags, 0.5), p99: percentile(lags, 0.99),
	}
}

func benchAsynq(b *testing.B, n, secs int) steadyResult {
	rd := testenv.StartRedis(b, testenv.WithPrivateServer())
	rc := rd.Client(b)
	s := asynq.NewScheduler(asynq.RedisClientOpt{Addr: rd.Addr}, &asynq.SchedulerOpts{LogLevel: asynq.FatalLevel})
	for i := range n {
		id := fmt.Sprintf("s%05d", i)
		if _, err := s.Register("@every 1s", asynq.NewTask("tick:"+id, []byte(`{"id":"`+id+`"}`))); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			s.Shutdown()
		}
	}
	b.Cleanup(stop)
	pending := func() int64 { return rc.LLen(context.Background(), taskstate.Keys("default").Pending()).Val() }
	testenv.Eventually(b, time.Minute, func() bool { return pending() >= int64(2*n) }, "asynq warm-up")
	from := nextSecond(b, time.Now).Add(windowOffset)
	waitUntil(b, time.Now, from)
	before := sample(testenv.RedisPID(b, rc), 0)
	count0 := pending()
	waitUntil(b, time.Now, from.Add(time.Duration(secs)*time.Second))
	used := sample(testenv.RedisPID(b, rc), 0).sub(before)
	fires := int(pending() - count0)
	stop()

	// asynq's task ids are random: take every task's pending_since and the
	// whole second before it as the scheduled time (asynq's @every 1s runs
	// on whole seconds; a lag of a second or more would show up as a pile
	// on some seconds, which the per-second counts rule out below).
	ids, err := rc.LRange(context.Background(), taskstate.Keys("default").Pending(), 0, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	perSecond := map[int64]int{}
	var lags []time.Duration
	for _, at := range pendingSince(b, rc, "default", ids) {
		if at.IsZero() || at.Before(from) || !at.Before(from.Add(time.Duration(secs)*time.Second)) {
			continue
		}
		sec := at.Truncate(time.Second)
		perSecond[sec.Unix()]++
		lags = append(lags, at.Sub(sec))
	}
	for sec, c := range perSecond {
		if c > n {
			b.Logf("asynq: %d tasks enqueued during %s (more than one tick's worth: lag may exceed 1 s)", c, time.Unix(sec, 0).Format(time.TimeOnly))
		}
	}
	return steadyResult{
		fires: fires,
		cpu:   perFire(used.self+used.redis, fires), proc: perFire(used.self, fires), redis: perFire(used.redis, fires),
		p50: percentile(lags, 0.5), p99: percentile(lags, 0.99),
	}
}

// burstProfile writes a CPU profile of the process from just before the
// instant to the returned stop, when CRONSTREAM_BENCH_BURST_PROFILE names a
// file: the burst alone, without the setup around it. With
// CRONSTREAM_BENCH_BURST_ALLOCS naming a file prefix, allocation profiles
// are written at both ends too (<prefix>.before, <prefix>.after; compare
// with go tool pprof -sample_index=alloc_space -base).
func burstProfile(b *testing.B, now func() time.Time, instant time.Time) (stop func()) {
	path := os.Getenv("CRONSTREAM_BENCH_BURST_PROFILE")
	if path == "" {
		return func() {}
	}
	// The allocation profile is as of the last completed GC: collect
	// before each snapshot, a second before the burst.
	allocs := os.Getenv("CRONSTREAM_BENCH_BURST_ALLOCS")
	writeHeap := func(suffix string) {
		if allocs == "" {
			return
		}
		runtime.GC()
		if h, err := os.Create(allocs + suffix); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(h, 0)
			_ = h.Close()
		}
	}
	waitUntil(b, now, instant.Add(-time.Second))
	writeHeap(".before")
	waitUntil(b, now, instant.Add(-200*time.Millisecond))
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			_ = f.Close()
			writeHeap(".after")
		})
	}
	b.Cleanup(stop)
	return stop
}

// BenchmarkSameInstant100k: 100,000 entries due at the same instant, twice:
// their first tick ever (every watermark key new) and, a day later by the
// scheduler's clock, their second (what a daily burst costs from then on).
// Reports for each the time until all tasks are in Redis and until all
// fired events are in the stream, and the fire lag (goal: p99 ≤ 2 s).
func BenchmarkSameInstant100k(b *testing.B) {
	n := envInt("CRONSTREAM_BENCH_INSTANT_ENTRIES", 100_000)
	for range b.N {
		srv := startBenchNATS(b)
		rd := testenv.StartRedis(b, testenv.WithPrivateServer())
		rc := rd.Client(b)
		_, js := benchConnect(b, srv.url)
		if err := events.EnsureStreams(context.Background(), js, events.StreamConfig{Names: testNames}); err != nil {
			b.Fatal(err)
		}
		// Every entry ticks daily at midnight UTC; once everything is
		// loaded the scheduler's clock is moved to 3 s before the next
		// midnight (nothing else is due before it, however long the setup
		// took), and after that burst to 3 s before the one after.
		eventtest.Register(b, js, testNames, "bench", entriesOf(n, func(i int) events.Entry { return every(fmt.Sprintf("i%06d", i), "0 0 0 * * *") }), 30*time.Second)
		clock := newShiftClock(b, 0)
		r := startBenchReplica(b, srv.url, rc, clock.clock)
		// Loaded means applied, watermarks read and asynq's entries
		// written once: the burst must not meet the replica's own start.
		visKey := taskstate.SchedulerEntriesKey(taskstate.ReplicaSchedulerID(testPrefix, "bench"))
		testenv.Eventually(b, 5*time.Minute, func() bool {
			st := readCounts(r.metrics)
			return st.Entries == n && st.Loading == 0 && rc.Exists(context.Background(), visKey).Val() == 1
		}, "scheduler to load %d entries", n)
		pid := testenv.RedisPID(b, rc)
		first := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
		for round, name := range []string{"first", "second"} {
			instant := first.Add(time.Duration(round) * 24 * time.Hour)
			offset := instant.Add(-3 * time.Second).Sub(time.Now())
			clock.set(b, offset)
			stopProfile := func() {}
			if round == 0 {
				stopProfile = burstProfile(b, clock.now, instant)
			}
			waitUntil(b, clock.now, instant)
			before := sample(pid, srv.pid)
			allocs := heapAllocs()
			var burst cpuSample
			var allocated uint64
			pendingKey := taskstate.Keys("default").Pending()
			want := int64(n * (round + 1))
			var inRedis, inStream time.Duration
			testenv.Eventually(b, 5*time.Minute, func() bool {
				if inRedis == 0 && rc.LLen(context.Background(), pendingKey).Val() >= want {
					inRedis = clock.now().Sub(instant)
					burst = sample(pid, srv.pid).sub(before)
					allocated = heapAllocs() - allocs
					stopProfile()
				}
				if inRedis == 0 {
					return false
				}
				if testenv.StreamMsgCount(js, testNames.ActivityStream()) < uint64(want) {
					return false
				}
				inStream = clock.now().Sub(instant)
				return true
			}, "all %d tasks in Redis and events in the stream", want)
			ids := make([]string, n)
			for i := range n {
				ids[i] = schedule.TaskID(testPrefix, fmt.Sprintf("i%06d", i), instant)
			}
			var lags []time.Duration
			for _, at := range pendingSince(b, rc, "default", ids) {
				if !at.IsZero() {
					lags = append(lags, at.Add(offset).Sub(instant))
				}
			}
			if len(lags) != n {
				b.Errorf("%s tick: %d of %d tasks found", name, len(lags), n)
			}
			p50, p99, pmax := percentile(lags, 0.5), percentile(lags, 0.99), percentile(lags, 1)
			suffix := ""
			if round > 0 {
				suffix = "-" + name
			}
			b.ReportMetric(inRedis.Seconds(), "s-all-in-redis"+suffix)
			b.ReportMetric(inStream.Seconds(), "s-all-in-stream"+suffix)
			b.ReportMetric(float64(p50.Milliseconds()), "lag-p50-ms"+suffix)
			b.ReportMetric(float64(p99.Milliseconds()), "lag-p99-ms"+suffix)
			b.ReportMetric(float64(allocated)/float64(n), "alloc-B/fire"+suffix)
			b.Logf("%s tick of %d entries at one instant: all in Redis after %s (CPU meanwhile: process %s, redis %s, nats %s; the process allocated %d bytes per fire), all fired events in the stream after %s; lag p50 %s p99 %s max %s",
				name, n, inRedis.Round(time.Millisecond), burst.self.Round(time.Millisecond), burst.redis.Round(time.Millisecond), burst.nats.Round(time.Millisecond),
				allocated/uint64(n), inStream.Round(time.Millisecond), p50, p99, pmax)
		}
		r.stop()
	}
}

// heapAllocs is the bytes this process has allocated on the heap so far
// (runtime/metrics, which unlike ReadMemStats stops nothing).
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
