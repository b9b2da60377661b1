package systembench

import "testing"

// BenchmarkOverload offers one replica twice its capacity and measures the
// fires a second it keeps. The replica runs as in BenchmarkScaleOut (a CPU
// group of its own, GOMAXPROCS=1, 8 queues, nats-server a process of its
// own); cap(1) is CRONSTREAM_BENCH_CAP1 when set, else searched in the same
// run as BenchmarkScaleOut searches it (its variables apply). Then a fresh
// deployment of 2 × cap(1) entries `@every 1s` fires for a window of D
// seconds after the warm-up.
//
// It reports cap(1) (cap1-entries), the ticks of the window that fired, a
// second (fires/s: what the replica keeps up with; a tick fired up to 5 s
// after the window's end counts, one from before its start fired during it
// does not), that against cap(1) (kept-of-cap1; goal ≥ 0.9), the
// lag p99 and the ticks missed in the window, the late entries the
// replica's stall detector shows at the window's end
// (cronstream_late_entries), what the replica shows it can fire at the
// window's end (cronstream_fire_capacity: shown-fires/s, to hold against
// fires/s), the skipped records it wrote, and
// redis-server's and nats-server's CPU in cores (void: 1 when either was
// over 70% of a core, so the figure measures the machine).
//
//	CRONSTREAM_BENCH_CAP1=<cap(1) of BenchmarkScaleOut> CRONSTREAM_BENCH_SCALE_SECONDS=60 go test -run '^$' -bench BenchmarkOverload -benchtime 1x -count 3 -timeout 60m -v ./internal/systembench/
//
// CRONSTREAM_BENCH_SCALE_SECONDS is D (default 10). It skips, saying why,
// where no CPU group can be made.
func BenchmarkOverload(b *testing.B) {
	cfg := scaleConfigFromEnv(b)
	requireCPUGroups(b, cfg.cores)
	for range b.N {
		cap1, source := envInt("CRONSTREAM_BENCH_CAP1", 0), "CRONSTREAM_BENCH_CAP1"
		if cap1 == 0 {
			s := searchCap(b, cfg, 1, 0)
			b.Logf("%s", s)
			if s.cap == 0 {
				b.Fatalf("no probe held: cap(1) is below %d entries, nothing to overload (%s)", minProbeEntries, s)
			}
			cap1, source = s.cap, "searched in this run"
		}
		offered := 2 * cap1
		d := deploy(b, deployConfig{entries: offered, queues: cfg.queues, replicas: 1, cores: cfg.cores, gomaxprocs: 1, warmup: cfg.warmup})
		w := d.measure(cfg.secs)
		d.close()
		kept := w.firesPerSec() / float64(cap1)
		void := 0.0
		if v := w.voidReason(); v != "" {
			void = 1
			b.Logf("VOID: %s: the fires a second kept measure the machine", v)
		}
		b.ReportMetric(float64(cap1), "cap1-entries")
		b.ReportMetric(w.firesPerSec(), "fires/s")
		b.ReportMetric(kept, "kept-of-cap1")
		b.ReportMetric(ms(w.lagP99), "lag-p99-ms")
		b.ReportMetric(float64(w.missed), "missed-ticks")
		b.ReportMetric(w.late, "late-entries")
		b.ReportMetric(w.shown, "shown-fires/s")
		b.ReportMetric(w.attempts.skipped, "skipped-records")
		b.ReportMetric(w.cores(w.redis), "redis-cores")
		b.ReportMetric(w.cores(w.nats), "nats-cores")
		b.ReportMetric(w.cores(w.replicaCPU()), "replica-cores")
		b.ReportMetric(void, "void")
		b.Logf("cap(1) %d entries (%s); offered %d: kept %.0f fires/s, %.2f of cap(1). %s", cap1, source, offered, w.firesPerSec(), kept, w)
	}
}
