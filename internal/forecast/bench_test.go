package forecast

import (
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// BenchmarkCompute forecasts 24 hours of 100,000 entries of a few specs,
// one in ten with jitter (each computed on its own), one in seven in
// another zone.
func BenchmarkCompute(b *testing.B) {
	crons := []string{"* * * * *", "*/5 * * * *", "0 9 * * 1-5", "@every 30s", "@daily", "30 */2 * * *", "@every 10m", "0 0 * * *"}
	entries := make([]contract.Entry, 100_000)
	for i := range entries {
		e := contract.Entry{ID: fmt.Sprintf("entry-%06d", i), Cron: crons[i%len(crons)], Options: contract.Options{Queue: fmt.Sprint("q", i%5)}}
		if i%10 == 0 {
			e.Jitter = contract.Duration(5 * time.Minute)
		}
		if i%7 == 0 {
			e.Timezone = "Europe/Berlin"
		}
		entries[i] = e
	}
	from := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for b.Loop() {
		Compute(entries, Params{From: from})
	}
}
