package systembench

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkScaleOut measures how capacity grows with replicas. Each replica
// is a `cronstream run` process with GOMAXPROCS=1 in a CPU group of its
// own (a cgroup quota, by default a tenth of a core), so that the machine's
// two cores are not what runs out; redis-server and nats-server (a process
// of its own) run without a quota, their CPU measured. Entries are
// `@every 1s`, spread round-robin over 8 queues.
//
// For each number of replicas N it searches cap(N): the most entries the
// deployment holds over a window of D seconds, where held means every tick
// of the window fired (its task in Redis within 5 s of the window's end),
// lag p99 (the task's pending_since minus its tick) at most 1 s, and the
// backlog of fires without an event in the activity stream not growing by
// more than a second's fires a minute (its least-squares slope over the
// window). Each probe is a fresh deployment (new servers,
// entries registered, replicas started, ready, one tick of every entry
// fired, then a warm-up of W seconds) torn down after its window. The
// search doubles from S·N entries while probes hold, halves while they do
// not, then bisects between the most held and the least not held until
// they are within R of each other or P probes are spent. A probe where
// redis-server or nats-server used more than 70% of a core measured the
// machine: it is void, the search stops there, and cap(N) is the most
// held below it, reported as void.
//
// The N values are interleaved: each round runs a search for every N, in
// an order rotated from round to round; a search after the first for the
// same N starts from the median so far and steps by 1+R instead of 2, so
// that a cap that holds again closes its bracket in two probes. It
// reports, per N, the median over the rounds of cap(N) (N1-cap, N2-cap...),
// cap(N)/(N·cap(1)) of the medians (N2-scale...), and at the probe that
// gave cap(N): redis-server's and nats-server's CPU in cores, the replicas'
// mean CPU in cores, the lag p99, and how many rounds ended at a void
// probe.
//
//	CRONSTREAM_BENCH_SCALE_SECONDS=60 CRONSTREAM_BENCH_SCALE_ROUNDS=3 CRONSTREAM_BENCH_SCALE_RESOLUTION=5 CRONSTREAM_BENCH_SCALE_PROBES=14 go test -run '^$' -bench BenchmarkScaleOut -benchtime 1x -timeout 24h -v ./internal/systembench/
//
// CRONSTREAM_BENCH_SCALE_REPLICAS lists the N (default 1,2,3,4),
// CRONSTREAM_BENCH_SCALE_SECONDS is D (default 10), CRONSTREAM_BENCH_SCALE_ROUNDS
// the rounds (default 1), CRONSTREAM_BENCH_SCALE_START is S (default 500),
// CRONSTREAM_BENCH_SCALE_RESOLUTION is R in percent (default 25),
// CRONSTREAM_BENCH_SCALE_PROBES is P (default 8),
// CRONSTREAM_BENCH_SCALE_PRIOR lists caps an earlier run found as N:entries
// pairs (for example 1:4750,2:11000), which the first round starts from as
// later rounds start from the median, CRONSTREAM_BENCH_CORES
// the share of a core per replica (default 0.1; 0 runs without groups),
// CRONSTREAM_BENCH_QUEUES the queues (default 8) and
// CRONSTREAM_BENCH_WARMUP_SECONDS is W (default 5). The defaults prove the
// wiring; the command above is the measurement. It skips, saying why, where
// no CPU group can be made (cgroup v1's cpu.cfs_quota_us or v2's cpu.max
// not writable: not root, no cpu controller).
func BenchmarkScaleOut(b *testing.B) {
	cfg := scaleConfigFromEnv(b)
	requireCPUGroups(b, cfg.cores)
	for range b.N {
		searches := map[int][]capSearch{}
		for round := range cfg.rounds {
			for _, n := range rotate(cfg.replicas, round) {
				prior := medianCap(searches[n])
				if prior == 0 {
					prior = cfg.priors[n]
				}
				s := searchCap(b, cfg, n, prior)
				b.Logf("round %d: %s", round+1, s)
				searches[n] = append(searches[n], s)
			}
		}
		reportScale(b, cfg, searches)
	}
}

// scaleConfig is the setting of BenchmarkScaleOut and BenchmarkOverload.
type scaleConfig struct {
	replicas   []int
	rounds     int
	secs       int
	queues     int
	cores      float64
	start      int     // the first probe's entries per replica
	resolution float64 // stop bisecting once the bracket is within this share of its lower end
	probes     int     // at most this many probes per search
	warmup     time.Duration
	priors     map[int]int // N → a cap found before, where the first round starts
}

func scaleConfigFromEnv(b testing.TB) scaleConfig {
	return scaleConfig{
		replicas:   envInts(b, "CRONSTREAM_BENCH_SCALE_REPLICAS", []int{1, 2, 3, 4}),
		rounds:     envInt("CRONSTREAM_BENCH_SCALE_ROUNDS", 1),
		secs:       envInt("CRONSTREAM_BENCH_SCALE_SECONDS", 10),
		queues:     envInt("CRONSTREAM_BENCH_QUEUES", 8),
		cores:      envFloat(b, "CRONSTREAM_BENCH_CORES", 0.1),
		start:      envInt("CRONSTREAM_BENCH_SCALE_START", 500),
		resolution: float64(envInt("CRONSTREAM_BENCH_SCALE_RESOLUTION", 25)) / 100,
		probes:     envInt("CRONSTREAM_BENCH_SCALE_PROBES", 8),
		warmup:     time.Duration(envInt("CRONSTREAM_BENCH_WARMUP_SECONDS", 5)) * time.Second,
		priors:     envPairs(b, "CRONSTREAM_BENCH_SCALE_PRIOR"),
	}
}

// envPairs reads comma-separated N:value pairs of positive integers.
func envPairs(b testing.TB, name string) map[int]int {
	v := os.Getenv(name)
	out := map[int]int{}
	if v == "" {
		return out
	}
	for _, f := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(f), ":")
		n, err1 := strconv.Atoi(k)
		x, err2 := strconv.Atoi(val)
		if !ok || err1 != nil || err2 != nil || n < 1 || x < 1 {
			b.Fatalf("%s=%q: want N:entries pairs of positive integers separated by commas", name, v)
		}
		out[n] = x
	}
	return out
}

// envInts reads a comma-separated list of positive integers.
func envInts(b testing.TB, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want positive integers separated by commas", name, v)
		}
		out = append(out, n)
	}
	return out
}

// envFloat reads a number of at least 0.
func envFloat(b testing.TB, name string, def float64) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0) {
		b.Fatalf("%s=%q: want a number of at least 0", name, v)
	}
	return f
}

// requireCPUGroups skips the benchmark, saying why, when no CPU group of
// cores can be made here.
func requireCPUGroups(b *testing.B, cores float64) {
	b.Helper()
	if cores == 0 {
		return
	}
	_, err := testenv.NewCPUGroup(b, "check", cores)
	if errors.Is(err, testenv.ErrNoCPUGroup) {
		b.Skipf("each replica needs a CPU group of %v of a core: %v (run as root where cgroup v1's cpu.cfs_quota_us or v2's cpu.max is writable, or set CRONSTREAM_BENCH_CORES=0 to run without quotas)", cores, err)
	}
	if err != nil {
		b.Fatal(err)
	}
}

// rotate is xs started at its round-th element, so that each round visits
// the values in a different order.
func rotate(xs []int, round int) []int {
	k := round % len(xs)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}

// capSearch is one search for cap(N).
type capSearch struct {
	replicas int
	cap      int    // the most entries held (0: none of the probes held)
	best     window // the probe at cap
	probes   []probe
	void     string // the void probe the search stopped at ("" none)
	resolved bool   // the bracket closed within the resolution
}

type probe struct {
	entries int
	w       window
}

// minProbeEntries is the fewest entries a search probes.
const minProbeEntries = 10

// searchCap searches cap(n), starting from prior when an earlier round (or
// run) found one.
func searchCap(b *testing.B, cfg scaleConfig, n, prior int) capSearch {
	b.Helper()
	s := capSearch{replicas: n}
	x, step := cfg.start*n, 2.0
	if prior > 0 {
		x, step = prior, 1+cfg.resolution
	}
	lo, hi := 0, 0 // the most entries held, the fewest not held (0: none yet)
	for len(s.probes) < cfg.probes && x >= minProbeEntries {
		w := probeCap(b, cfg, n, x)
		s.probes = append(s.probes, probe{entries: x, w: w})
		if v := w.voidReason(); v != "" {
			s.void = fmt.Sprintf("at %d entries %s", x, v)
			break
		}
		if w.held() {
			lo, s.best = x, w
		} else {
			hi = x
		}
		switch {
		case hi == 0:
			x = max(int(float64(x)*step), x+1)
		case lo == 0:
			x = min(int(float64(x)/step), x-1)
		default:
			x = (lo + hi) / 2
		}
		if lo > 0 && hi > 0 && (float64(hi-lo) <= cfg.resolution*float64(lo) || x == lo) {
			s.resolved = true
			break
		}
	}
	s.cap = lo
	return s
}

// probeCap deploys x entries on n replicas, measures a window and tears the
// deployment down.
func probeCap(b *testing.B, cfg scaleConfig, n, x int) window {
	b.Helper()
	d := deploy(b, deployConfig{entries: x, queues: cfg.queues, replicas: n, cores: cfg.cores, gomaxprocs: 1, warmup: cfg.warmup})
	w := d.measure(cfg.secs)
	d.close()
	verdict := "held"
	switch {
	case w.voidReason() != "":
		verdict = "VOID: " + w.voidReason()
	case !w.held():
		verdict = "not held: " + strings.Join(w.heldReasons(), "; ")
	}
	b.Logf("N=%d probe at %d entries: %s. %s", n, x, verdict, w)
	return w
}

func (s capSearch) String() string {
	var tried []string
	for _, p := range s.probes {
		mark := "no"
		switch {
		case p.w.voidReason() != "":
			mark = "void"
		case p.w.held():
			mark = "held"
		}
		tried = append(tried, fmt.Sprintf("%d %s", p.entries, mark))
	}
	out := fmt.Sprintf("cap(%d) = %d entries (probes: %s)", s.replicas, s.cap, strings.Join(tried, ", "))
	switch {
	case s.void != "":
		out += "; VOID: stopped " + s.void + ": the capacity above it is the machine's"
	case !s.resolved:
		out += "; the probes ran out before the bracket closed"
	}
	return out
}

func medianCap(ss []capSearch) int {
	var caps []float64
	for _, s := range ss {
		caps = append(caps, float64(s.cap))
	}
	return int(median(caps))
}

// median is the middle value (the mean of the two middle ones for an even
// count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	m := len(xs) / 2
	if len(xs)%2 == 0 {
		return (xs[m-1] + xs[m]) / 2
	}
	return xs[m]
}

// reportScale reports the medians over the rounds, per N.
func reportScale(b *testing.B, cfg scaleConfig, searches map[int][]capSearch) {
	cap1 := float64(medianCap(searches[1]))
	ns := slices.Sorted(func(yield func(int) bool) {
		for n := range searches {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range ns {
		var redisCores, natsCores, replicaCores, lag []float64
		voids := 0
		for _, s := range searches[n] {
			if s.void != "" {
				voids++
			}
			if s.cap == 0 {
				continue
			}
			w := s.best
			redisCores = append(redisCores, w.cores(w.redis))
			natsCores = append(natsCores, w.cores(w.nats))
			replicaCores = append(replicaCores, w.cores(w.replicaCPU())/float64(n))
			lag = append(lag, ms(w.lagP99))
		}
		c := float64(medianCap(searches[n]))
		b.ReportMetric(c, fmt.Sprintf("N%d-cap", n))
		if cap1 > 0 {
			b.ReportMetric(c/(float64(n)*cap1), fmt.Sprintf("N%d-scale", n))
		}
		b.ReportMetric(median(redisCores), fmt.Sprintf("N%d-redis-cores", n))
		b.ReportMetric(median(natsCores), fmt.Sprintf("N%d-nats-cores", n))
		b.ReportMetric(median(replicaCores), fmt.Sprintf("N%d-replica-cores", n))
		b.ReportMetric(median(lag), fmt.Sprintf("N%d-lag-p99-ms", n))
		b.ReportMetric(float64(voids), fmt.Sprintf("N%d-void-rounds", n))
		scale := "cap(1) not measured"
		if cap1 > 0 {
			scale = fmt.Sprintf("%.2f of N·cap(1)", c/(float64(n)*cap1))
		}
		b.Logf("N=%d: median cap %.0f entries over %d round(s) (%s); at the cap: redis-server %.3f, nats-server %.3f, each replica %.3f of a core (quota %v), lag p99 %.0f ms; %d round(s) void",
			n, c, len(searches[n]), scale, median(redisCores), median(natsCores), median(replicaCores), cfg.cores, median(lag), voids)
	}
}
