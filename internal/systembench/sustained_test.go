package systembench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkSustained measures steady firing through real replica
// processes: N entries `@every 1s` for D seconds with one replica and with
// three (each `cronstream run`, relay on, every replica hearing every fire
// on its subscription), after a warm-up of two ticks per entry.
//
// It reports, over the measured window: the fire lag p50/p99 (enqueue time
// minus scheduled second, from the fired events), ticks with no fire, CPU
// per fire of the replica processes plus redis-server (from /proc; the
// embedded nats-server runs in the test process and is reported apart),
// fires/s and events/s published to the activity stream, the backlog of
// fires not yet in the stream sampled every 250 ms (its largest value and
// its slope over the second half of the window: a backlog that does not
// grow has a slope near 0), each fired event's delay into the stream (its stream timestamp minus
// its enqueue time; p99 and max), and, once the replicas are stopped with
// SIGTERM at the window's end, the time from the last fire until its event
// is in the stream (-1 when some fires never reached it: the benchmark then
// fails and says how many, and how many records were left in the outbox).
//
//	CRONSTREAM_BENCH_ENTRIES=30000 CRONSTREAM_BENCH_SECONDS=60 go test -run '^$' -bench BenchmarkSustained -benchtime 1x -timeout 60m -v ./internal/systembench/
//
// CRONSTREAM_BENCH_ENTRIES is N (default 1,000), CRONSTREAM_BENCH_SECONDS
// is D (default 10); -bench 'BenchmarkSustained/replicas=1' runs one side.
// CRONSTREAM_BENCH_PERF names a file: the first replica's CPU is then
// recorded over the window with perf (perf record -e cpu-clock -g; read it
// with perf report --children), where perf is installed.
//
// replicas=3vs1 compares the two sides in rounds (replicaCost).
func BenchmarkSustained(b *testing.B) {
	n := envInt("CRONSTREAM_BENCH_ENTRIES", 1_000)
	secs := envInt("CRONSTREAM_BENCH_SECONDS", 10)
	for _, k := range []int{1, 3} {
		b.Run(fmt.Sprintf("replicas=%d", k), func(b *testing.B) {
			for range b.N {
				sustained(b, n, secs, k)
			}
		})
	}
	b.Run("replicas=3vs1", func(b *testing.B) {
		for range b.N {
			replicaCost(b, n, secs)
		}
	})
}

// replicaCost compares three replicas with one, without CPU quotas, in
// interleaved rounds: each round deploys N entries `@every 1s` over 8
// queues with one replica and with three (the order alternating from round
// to round), each a fresh deployment with nats-server a process of its own
// and the warm-up of BenchmarkScaleOut, and measures a window of D seconds
// (fires read back from Redis, as BenchmarkScaleOut reads them).
//
// It reports, as medians over the rounds: the CPU per fire of the replica
// processes plus redis-server (r1-cpu-us/fire, r3-cpu-us/fire), each's
// redis-server and nats-server share, fires a second (the window's ticks
// that fired, a second), lag p99 and missed ticks; and the medians of each round's ratios, three against one: CPU
// per fire (cpu-ratio-3/1; goal ≤ 1.15 at 10,000 entries), fires a second
// (fires-ratio-3/1; goal ≥ 1 at 30,000), and the busiest of the three
// replicas' own CPU per fire against the lone replica's (busiest-ratio-3/1).
//
//	CRONSTREAM_BENCH_ENTRIES=10000 CRONSTREAM_BENCH_SECONDS=60 CRONSTREAM_BENCH_ROUNDS=3 go test -run '^$' -bench 'BenchmarkSustained/replicas=3vs1' -benchtime 1x -timeout 60m -v ./internal/systembench/
//
// CRONSTREAM_BENCH_ROUNDS is the rounds (default 2), CRONSTREAM_BENCH_QUEUES
// the queues (default 8), CRONSTREAM_BENCH_WARMUP_SECONDS the warm-up
// (default 5).
func replicaCost(b *testing.B, n, secs int) {
	rounds := envInt("CRONSTREAM_BENCH_ROUNDS", 2)
	cfg := deployConfig{entries: n, queues: envInt("CRONSTREAM_BENCH_QUEUES", 8),
		warmup: time.Duration(envInt("CRONSTREAM_BENCH_WARMUP_SECONDS", 5)) * time.Second}
	runs := map[int][]window{}
	for round := range rounds {
		order := []int{1, 3}
		if round%2 == 1 {
			order = []int{3, 1}
		}
		for _, k := range order {
			c := cfg
			c.replicas = k
			d := deploy(b, c)
			w := d.measure(secs)
			d.close()
			b.Logf("round %d: %s", round+1, w)
			runs[k] = append(runs[k], w)
		}
	}
	var cpuRatio, firesRatio, busiestRatio []float64
	for i := range rounds {
		one, three := runs[1][i], runs[3][i]
		cpuRatio = append(cpuRatio, ratio(three.perFire(three.replicaCPU()+three.redis), one.perFire(one.replicaCPU()+one.redis)))
		firesRatio = append(firesRatio, ratio(three.firesPerSec(), one.firesPerSec()))
		busiestRatio = append(busiestRatio, ratio(three.perFire(slices.Max(three.replicas)), one.perFire(one.replicaCPU())))
	}
	for _, k := range []int{1, 3} {
		var cpu, redisCPU, natsCPU, fires, lag, missed []float64
		for _, w := range runs[k] {
			cpu = append(cpu, w.perFire(w.replicaCPU()+w.redis))
			redisCPU = append(redisCPU, w.perFire(w.redis))
			natsCPU = append(natsCPU, w.perFire(w.nats))
			fires = append(fires, w.firesPerSec())
			lag = append(lag, ms(w.lagP99))
			missed = append(missed, float64(w.missed))
		}
		b.ReportMetric(median(cpu), fmt.Sprintf("r%d-cpu-us/fire", k))
		b.ReportMetric(median(redisCPU), fmt.Sprintf("r%d-redis-cpu-us/fire", k))
		b.ReportMetric(median(natsCPU), fmt.Sprintf("r%d-nats-cpu-us/fire", k))
		b.ReportMetric(median(fires), fmt.Sprintf("r%d-fires/s", k))
		b.ReportMetric(median(lag), fmt.Sprintf("r%d-lag-p99-ms", k))
		b.ReportMetric(median(missed), fmt.Sprintf("r%d-missed-ticks", k))
	}
	b.ReportMetric(median(cpuRatio), "cpu-ratio-3/1")
	b.ReportMetric(median(firesRatio), "fires-ratio-3/1")
	b.ReportMetric(median(busiestRatio), "busiest-ratio-3/1")
	b.Logf("%d entries, %d round(s): three replicas against one, per round: CPU per fire (replicas + redis-server) %s, fires a second %s, the busiest replica's CPU per fire against the lone one's %s",
		n, rounds, fmtRatios(cpuRatio), fmtRatios(firesRatio), fmtRatios(busiestRatio))
}

// ratio is a/b, 0 when b is.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func fmtRatios(rs []float64) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%.2f", r))
	}
	return strings.Join(parts, ", ")
}

func sustained(b *testing.B, n, secs, k int) {
	s := newSystem(b)
	s.register(entries("s", "@every 1s", n))
	var ps []*replicaProc
	for i := range k {
		ps = append(ps, s.startReplica(fmt.Sprintf("r%d", i)))
	}
	waitLoaded(b, ps, n, 10*time.Minute)
	testenv.Eventually(b, 5*time.Minute, func() bool { return s.pending("default") >= int64(2*n) }, "warm-up: two ticks per entry")

	from := nextSecond(700 * time.Millisecond)
	to := from.Add(time.Duration(secs) * time.Second)
	waitUntil(from)
	stopPerf := perfRecord(b, ps[0], os.Getenv("CRONSTREAM_BENCH_PERF"), 199)
	stopSampling := s.sampleBacklog(250*time.Millisecond, "default")
	resetCommandStats(b, s.rc)
	cpu0, fires0, msgs0, attempts0 := s.cpu(ps), s.pending("default"), s.activityMsgs(), fireAttempts(ps)
	waitUntil(to)
	used, fires, msgs := s.cpu(ps).sub(cpu0), int(s.pending("default")-fires0), int(s.activityMsgs()-msgs0)
	attempts := fireAttempts(ps).sub(attempts0)
	commands := commandStats(b, s.rc)
	samples := stopSampling()
	stopPerf()
	// A stopped replica flushes its outbox before it exits, for a while;
	// what is left then stays unpublished (no replica runs to take it
	// over), and shows as fires without an event.
	stopAll(b, ps)
	total := s.pending("default")
	unflushed := s.outboxLen(context.Background())

	log := s.readFires()
	var lags, delays []time.Duration
	seen := map[string]int{}
	var lastFire, lastStored time.Time
	for _, f := range log.fires {
		if f.enqueued.After(lastFire) {
			lastFire = f.enqueued
		}
		if f.inStream.After(lastStored) {
			lastStored = f.inStream
		}
		if f.scheduled.After(from) && f.scheduled.Before(to) {
			lags = append(lags, f.enqueued.Sub(f.scheduled))
			delays = append(delays, f.inStream.Sub(f.enqueued))
			seen[f.entry]++
		}
	}
	ticks := int(to.Unix() - from.Unix()) // the whole seconds inside (from, to)
	missed := 0
	for _, e := range entries("s", "", n) {
		missed += max(0, ticks-seen[e.ID])
	}
	if missed > 0 {
		b.Errorf("%d of %d ticks in the window have no fired event in the stream (%d skipped events in it)", missed, n*ticks, log.skipped)
	}
	unpublished := int(total) - len(log.fires)
	if unpublished != 0 {
		b.Errorf("%d tasks fired, %d fired events in the stream: %d fires unpublished (%d records left in the outbox when the replicas exited)",
			total, len(log.fires), unpublished, unflushed)
	}
	largest, slope := backlogTrend(samples)
	drain := lastStored.Sub(lastFire)
	if unpublished != 0 {
		drain = -1 // never: some fires have no event
	}
	cpu := usPer(used.replicas+used.redis, fires)

	b.ReportMetric(float64(fires)/float64(secs), "fires/s")
	b.ReportMetric(float64(msgs)/float64(secs), "events/s")
	b.ReportMetric(ms(percentile(lags, 0.5)), "lag-p50-ms")
	b.ReportMetric(ms(percentile(lags, 0.99)), "lag-p99-ms")
	b.ReportMetric(cpu, "cpu-us/fire")
	b.ReportMetric(usPer(used.replicas, fires), "process-cpu-us/fire")
	b.ReportMetric(usPer(used.redis, fires), "redis-cpu-us/fire")
	b.ReportMetric(usPer(used.self, fires), "nats+harness-cpu-us/fire")
	b.ReportMetric(float64(largest), "backlog-max-fires")
	b.ReportMetric(slope, "backlog-slope-fires/s")
	b.ReportMetric(ms(percentile(delays, 0.99)), "to-stream-p99-ms")
	b.ReportMetric(ms(percentile(delays, 1)), "to-stream-max-ms")
	b.ReportMetric(ms(drain), "last-fire-to-stream-ms")
	b.ReportMetric(float64(missed), "missed-ticks")
	b.ReportMetric(float64(unpublished), "unpublished-fires")
	b.Logf("%d entries @every 1s, %d replica(s), %d s: %d fires (%.0f/s), %d events published (%.0f/s), %d skipped events in the stream; lag p50 %s p99 %s max %s; %d ticks missed",
		n, k, secs, fires, float64(fires)/float64(secs), msgs, float64(msgs)/float64(secs), log.skipped,
		percentile(lags, 0.5).Round(time.Millisecond), percentile(lags, 0.99).Round(time.Millisecond), percentile(lags, 1).Round(time.Millisecond), missed)
	b.Logf("CPU per fire %.1f µs = replicas %.1f + redis-server %.1f; NATS and this harness %.1f µs more",
		cpu, usPer(used.replicas, fires), usPer(used.redis, fires), usPer(used.self, fires))
	b.Logf("Redis server time per fire by command: %s", commandsPer(commands, fires, 12))
	b.Logf("fire attempts by the replicas: %d fired, %d refused (%.2f attempts per fire), %d skipped records written",
		int(attempts.fired), int(attempts.refused), (attempts.fired+attempts.refused)/max(attempts.fired, 1), int(attempts.skipped))
	drained := "never (fires unpublished)"
	if drain >= 0 {
		drained = drain.Round(time.Millisecond).String()
	}
	b.Logf("backlog of fires not in the stream: largest %d, slope over the second half %+.1f fires/s (%d samples); fired event into the stream after p50 %s p99 %s max %s; last fire to its event in the stream %s",
		largest, slope, len(samples), percentile(delays, 0.5).Round(time.Millisecond), percentile(delays, 0.99).Round(time.Millisecond),
		percentile(delays, 1).Round(time.Millisecond), drained)
}

// perfRecord records p's CPU with perf, hz samples a second, into path
// until the returned stop (a no-op when path is empty). perf missing or
// refused is logged, not a failure: the profile is an aid, not a figure of
// the benchmark.
func perfRecord(b *testing.B, p *replicaProc, path string, hz int) (stop func()) {
	if path == "" {
		return func() {}
	}
	cmd := exec.Command("perf", "record", "-e", "cpu-clock", "-F", strconv.Itoa(hz), "-g", "-p", strconv.Itoa(p.pid()), "-o", path)
	if err := cmd.Start(); err != nil {
		b.Logf("perf record: %v (no profile)", err)
		return func() {}
	}
	return func() {
		// SIGINT makes perf write its file and exit.
		_ = cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); err != nil && !(ok && ws.Signaled() && ws.Signal() == syscall.SIGINT) {
			b.Logf("perf record: %v", err)
		}
		b.Logf("CPU profile of replica %s over the window: %s", p.id, path)
	}
}

// attempts are the replicas' fire outcomes, summed from their /metrics.
type attempts struct{ fired, refused, skipped float64 }

func fireAttempts(ps []*replicaProc) attempts {
	var a attempts
	for _, p := range ps {
		f, _ := p.metric("cronstream_fires_total")
		r, _ := p.metric("cronstream_fire_refused_total")
		sk, _ := p.metric("cronstream_skipped_total")
		a.fired, a.refused, a.skipped = a.fired+f, a.refused+r, a.skipped+sk
	}
	return a
}

func (a attempts) sub(o attempts) attempts {
	return attempts{a.fired - o.fired, a.refused - o.refused, a.skipped - o.skipped}
}
