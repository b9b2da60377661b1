package recoverer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/massrecovery"
	"github.com/cronstream/cronstream/internal/recoverer"
)

// BenchmarkPass measures a full recoverer pass (Recoverer.Pass: orphan
// walk, bounded listing, asynq's decision, one CloudEvent outbox record per
// task written with the move, aggregation-set check) over a mass crash: N
// lease-expired tasks with one tied lease score — a whole worker pool died
// in the same second — in an active list that also holds N/10 live tasks,
// in dequeue order (the oldest tasks at the list's tail, as asynq's LPUSH
// and RPOPLPUSH leave them; the lease set returns tied members in id order,
// which is unrelated to list order).
//
// Each iteration seeds the queue, runs our pass, seeds an identical queue
// (same seed, same ids) and runs asynq v0.26.0's recovery path on it in the
// same Redis: one listing script over the whole expired range, then one
// Retry script per task whose LREM with count 0 scans the active list
// (docs/asynq-compat.md "Retry and archive"; internal/massrecovery, shared with
// taskstate's BenchmarkRecover); both paths decode, decide and re-encode
// every message.
//
// Metrics: tasks/s (ours), asynq-tasks/s, x-asynq (the ratio), and
// max-script-ms, the slowest single script call of our pass (SLOWLOG).
//
//	go test -run '^$' -bench BenchmarkPass -benchtime 1x -count 3 ./recoverer/
func BenchmarkPass(b *testing.B) {
	rc := massrecovery.StartRedis(b, time.Millisecond)
	ctx := context.Background()
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			var ours, theirs time.Duration
			var slowest time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				now := time.Now()
				live := massrecovery.Seed(b, rc, n, now)
				rec, err := recoverer.New(recoverer.Config{
					Redis: rc, Names: names, ReplicaID: "bench", Queues: []string{massrecovery.Queue},
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				res := rec.Pass(ctx)
				ours += time.Since(start)
				b.StopTimer()
				if res.Err != nil || res.Moved != n {
					b.Fatalf("our pass moved %d of %d: %v", res.Moved, n, res.Err)
				}
				massrecovery.Check(b, rc, n, live)
				if got := outboxEventCount(b, rc, massrecovery.Queue); got != int64(n) {
					b.Fatalf("outbox has %d events, want %d", got, n)
				}
				for _, d := range massrecovery.ScriptDurations(b, rc) {
					slowest = max(slowest, d)
				}

				live = massrecovery.Seed(b, rc, n, now)
				start = time.Now()
				moved, err := massrecovery.RecoverAsynq(ctx, rc, now)
				theirs += time.Since(start)
				if err != nil || moved != n {
					b.Fatalf("asynq's path moved %d of %d: %v", moved, n, err)
				}
				massrecovery.Check(b, rc, n, live)
			}
			oursRate := float64(n) * float64(b.N) / ours.Seconds()
			theirRate := float64(n) * float64(b.N) / theirs.Seconds()
			b.ReportMetric(oursRate, "tasks/s")
			b.ReportMetric(theirRate, "asynq-tasks/s")
			b.ReportMetric(oursRate/theirRate, "x-asynq")
			b.ReportMetric(float64(slowest.Microseconds())/1000, "max-script-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
