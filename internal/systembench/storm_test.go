package systembench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkConfigStorm measures firing while `cronstream sync -f`
// publishes C changed entries: F entries `@every 1s` fire through K replica
// processes; C more entries in the same queue (so every config event moves
// the queue slot's revision fence, which refuses fires from a replica one
// event behind) tick once a leap year. After a baseline of 5 s, `sync -f`
// publishes a new payload for each of the C entries; the window runs on
// until 5 s after the command returned.
//
// It reports the fire lag p50/p99/max of the firing entries during the
// storm (from the tasks' pending_since) beside the baseline's p99, the
// ticks in the storm window with no fire (goal 0), the skipped events, the
// fires the replicas saw refused during the storm
// (cronstream_fire_refused_total: every reason, where watermark-mismatch is
// normal with several replicas, and revision-fenced alone), and how long
// the sync command took.
//
//	CRONSTREAM_BENCH_STORM_ENTRIES=10000 go test -run '^$' -bench BenchmarkConfigStorm -benchtime 1x -timeout 30m -v ./internal/systembench/
//
// CRONSTREAM_BENCH_STORM_ENTRIES is C (default 2,000),
// CRONSTREAM_BENCH_STORM_FIRING is F (default 1,000) and
// CRONSTREAM_BENCH_STORM_REPLICAS is K (default 3).
func BenchmarkConfigStorm(b *testing.B) {
	changed := envInt("CRONSTREAM_BENCH_STORM_ENTRIES", 2_000)
	firing := envInt("CRONSTREAM_BENCH_STORM_FIRING", 1_000)
	k := envInt("CRONSTREAM_BENCH_STORM_REPLICAS", 3)
	for range b.N {
		configStorm(b, firing, changed, k)
	}
}

// schedulesFile writes a schedules file for sync -f: firing entries
// f<i> `@every 1s` and changed entries c<i> ticking on 29 February, whose
// payload carries version.
func schedulesFile(b *testing.B, firing, changed int, version string) string {
	var sb strings.Builder
	sb.WriteString("entries:\n")
	for i := range firing {
		fmt.Fprintf(&sb, "  - id: f%06d\n    cron: \"@every 1s\"\n    task: {type: \"bench:f\", payload: '{\"id\":\"f%06d\"}'}\n", i, i)
	}
	for i := range changed {
		fmt.Fprintf(&sb, "  - id: c%06d\n    cron: \"0 0 29 2 *\"\n    task: {type: \"bench:c\", payload: '{\"id\":\"c%06d\",\"v\":\"%s\"}'}\n", i, i, version)
	}
	path := filepath.Join(b.TempDir(), "schedules-"+version+".yaml")
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}

// refused sums the replicas' refused fires: every reason, and the
// revision fence's alone.
func refused(ps []*replicaProc) (all, fenced float64) {
	for _, p := range ps {
		v, _ := p.metric("cronstream_fire_refused_total")
		f, _ := p.metric(`cronstream_fire_refused_total{status="revision-fenced"}`)
		all, fenced = all+v, fenced+f
	}
	return all, fenced
}

func configStorm(b *testing.B, firing, changed, k int) {
	s := newSystem(b)
	setup := s.command("sync", "-f", schedulesFile(b, firing, changed, "v1"))
	storm := schedulesFile(b, firing, changed, "v2")
	var ps []*replicaProc
	for i := range k {
		ps = append(ps, s.startReplica(fmt.Sprintf("r%d", i)))
	}
	waitLoaded(b, ps, firing+changed, 10*time.Minute)
	testenv.Eventually(b, 5*time.Minute, func() bool { return s.pending("default") >= int64(2*firing) }, "warm-up: two ticks per firing entry")

	from := nextSecond(700 * time.Millisecond)
	waitUntil(from.Add(5 * time.Second))
	refused0, fenced0 := refused(ps)
	syncStart := time.Now()
	took := s.command("sync", "-f", storm)
	to := syncStart.Add(took + 5*time.Second)
	waitUntil(to)
	refusedAll, fencedAll := refused(ps)
	refusals, fenced := refusedAll-refused0, fencedAll-fenced0
	stopAll(b, ps)
	total := s.pending("default")
	testenv.Eventually(b, 5*time.Minute, func() bool { return s.activityMsgs() >= uint64(total) }, "the events of all %d fires in the activity stream", total)

	log := s.readFires()
	var base, during []time.Duration
	fired := map[string]bool{}
	for _, f := range log.fires {
		lag := f.enqueued.Sub(f.scheduled)
		switch {
		case f.scheduled.After(from) && f.scheduled.Before(syncStart):
			base = append(base, lag)
		case f.scheduled.After(syncStart) && f.scheduled.Before(to):
			during = append(during, lag)
			fired[fmt.Sprintf("%s@%d", f.entry, f.scheduled.Unix())] = true
		}
	}
	missed := 0
	for sec := syncStart.Unix() + 1; sec < to.Unix(); sec++ {
		for i := range firing {
			if !fired[fmt.Sprintf("f%06d@%d", i, sec)] {
				missed++
			}
		}
	}
	if missed > 0 {
		b.Errorf("%d ticks of the firing entries had no fire during the storm", missed)
	}
	b.ReportMetric(ms(percentile(during, 0.5)), "storm-lag-p50-ms")
	b.ReportMetric(ms(percentile(during, 0.99)), "storm-lag-p99-ms")
	b.ReportMetric(ms(percentile(during, 1)), "storm-lag-max-ms")
	b.ReportMetric(ms(percentile(base, 0.99)), "baseline-lag-p99-ms")
	b.ReportMetric(float64(missed), "missed-ticks")
	b.ReportMetric(took.Seconds(), "s-sync")
	b.ReportMetric(fenced, "fenced-fires")
	b.Logf("%d firing entries, %d replicas; sync -f of %d changed entries took %s (setting them up: %s); during the storm (%d fires): lag p50 %s p99 %s max %s; baseline before it p99 %s (%d fires); %d ticks missed, %d skipped events in the stream, %.0f fires refused (%.0f by the revision fence)",
		firing, k, changed, took.Round(time.Millisecond), setup.Round(time.Millisecond), len(during),
		percentile(during, 0.5).Round(time.Millisecond), percentile(during, 0.99).Round(time.Millisecond), percentile(during, 1).Round(time.Millisecond),
		percentile(base, 0.99).Round(time.Millisecond), len(base), missed, log.skipped, refusals, fenced)
}
