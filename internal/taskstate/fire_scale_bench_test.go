package taskstate

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// BenchmarkFireScale measures redis-server's CPU per fire (INFO cpu) as a
// scheduler's steady firing costs it, at two numbers of entries: each
// entry ticks in turn, fired through FireBatch in batches of 1,000 as the
// scheduler sends them, with its asynq enqueue history recorded beside
// (trimmed every 16th event, as the scheduler does). Two ticks of every
// entry warm up; the next ones are measured. Redis time per fire that grows
// with the number of entries shows here apart from the rest of a replica.
//
//	go test -run '^$' -bench BenchmarkFireScale -benchtime 1x ./internal/taskstate/
//
// CRONSTREAM_BENCH_ENTRIES, a comma-separated list, replaces the default
// sizes 10000,30000; CRONSTREAM_BENCH_TICKS the measured ticks (default 4).
func BenchmarkFireScale(b *testing.B) {
	sizes := []int{10_000, 30_000}
	if v := os.Getenv("CRONSTREAM_BENCH_ENTRIES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("CRONSTREAM_BENCH_ENTRIES: %q", v)
			}
			sizes = append(sizes, n)
		}
	}
	ticks := 4
	if v, err := strconv.Atoi(os.Getenv("CRONSTREAM_BENCH_TICKS")); err == nil && v > 0 {
		ticks = v
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			for range b.N {
				fireScale(b, n, ticks)
			}
		})
	}
}

func fireScale(b *testing.B, n, ticks int) {
	b.StopTimer()
	rc := testenv.StartRedis(b, testenv.WithPrivateServer()).Client(b)
	s := New(rc)
	ctx := context.Background()
	entries := make([]string, n)
	for i := range entries {
		entries[i] = fmt.Sprintf("s%05d", i)
	}
	const batch = 1000
	fires := make([]Fire, 0, batch)
	hist := make([]EnqueueEventRecord, 0, batch)
	tick := func(t int) {
		at := time.Unix(1_800_000_000+int64(t), 0).UTC()
		var prev time.Time
		if t > 0 {
			prev = at.Add(-time.Second)
		}
		for start := 0; start < n; start += batch {
			fires, hist = fires[:0], hist[:0]
			for _, e := range entries[start:min(start+batch, n)] {
				fires = append(fires, tickFire(e, "default", at, prev))
				hist = append(hist, EnqueueEventRecord{Entry: e, Event: SchedulerEnqueueEvent{TaskID: taskIDFor(e, at), EnqueueTime: at}, Trim: t%16 == 0})
			}
			res, err := s.FireBatch(ctx, testFences, fires)
			if err != nil {
				b.Fatal(err)
			}
			for i := range res {
				if res[i].Status != StatusFired {
					b.Fatalf("fire %d: %s", i, res[i].Status)
				}
			}
			if err := s.RecordSchedulerEnqueueEvents(ctx, hist); err != nil {
				b.Fatal(err)
			}
		}
	}
	for t := range 2 {
		tick(t)
	}
	cpu0 := testenv.RedisCPU(b, rc)
	b.StartTimer()
	for t := 2; t < 2+ticks; t++ {
		tick(t)
	}
	b.StopTimer()
	fired := float64(n * ticks)
	b.ReportMetric((testenv.RedisCPU(b, rc)-cpu0).Seconds()*1e6/fired, "redis-cpu-µs/fire")
	b.ReportMetric(fired/b.Elapsed().Seconds(), "fires/s")
}
