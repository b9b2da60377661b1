package projector

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
)

// maxBytesPerEntry is the projection's memory budget per entry (issue 35:
// every replica holds the whole projection, which the fences, describe and
// the console need).
const maxBytesPerEntry = 1024

// realisticEntry is entry i as teams write them in a schedules file
// (docs/entries.md): an id naming team and job, a handful of specs and
// zones, a JSON payload of some 120 bytes of its own, headers on a third,
// queue options, catch-up, overlap and jitter on some, two labels, an
// owner, a note on a tenth.
func realisticEntry(i int) events.Entry {
	teams := []string{"billing", "reports", "search", "mail", "ops", "growth", "identity", "data"}
	team := teams[i%len(teams)]
	e := events.Entry{
		ID:       fmt.Sprintf("%s-%s-%06d", team, []string{"invoice", "digest", "reindex", "cleanup", "export"}[i%5], i),
		Cron:     []string{"0 9 * * 1-5", "*/5 * * * *", "@every 1m", "30 2 * * *", "0 */6 * * *", "15 * * * *", "0 0 1 * *", "@every 30s"}[i%8],
		Timezone: []string{"UTC", "UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"}[i%5],
		Task: events.Task{
			Type:    team + ":" + []string{"run", "sync", "notify"}[i%3],
			Payload: []byte(fmt.Sprintf(`{"tenant_id":"t-%08d","account":%d,"region":"eu-west-1","format":"pdf","locale":"de-DE","retry_budget":3}`, i*7919, i)),
		},
		Options: events.Options{Queue: team, MaxRetry: new(5), Timeout: events.Duration(10 * time.Minute), Retention: events.Duration(24 * time.Hour)},
		Labels:  map[string]string{"team": team, "tier": []string{"critical", "standard", "batch"}[i%3]},
		Owner:   "sync",
	}
	if i%3 == 0 {
		e.Task.Headers = map[string]string{"source": "cron", "trace-sampled": "1"}
	}
	if i%2 == 0 {
		e.Catchup = events.Catchup{Policy: events.CatchupLatest, Window: events.Duration(time.Hour)}
	}
	if i%4 == 0 {
		e.Overlap = events.OverlapSkip
	}
	if i%3 == 1 {
		e.Jitter = events.Duration(30 * time.Second)
	}
	if i%10 == 0 {
		e.Note = fmt.Sprintf("owned by %s on-call; see runbook %d", team, i%97)
	}
	return e.Normalize()
}

// foldRealistic folds n realistic entries' registrations, as a replica's
// projection holds them after its initial load.
func foldRealistic(tb testing.TB, n int) *Fold {
	f := NewFold(testNames)
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		e := realisticEntry(i)
		data := eventtest.MarshalAt(tb, events.NewEventID(), at, events.TypeEntryRegistered, "sync", e.ID, e)
		if _, _, err := f.Apply(testNames.ConfigSubject(e.ID), uint64(i+1), at, data); err != nil {
			tb.Fatalf("entry %s: %v", e.ID, err)
		}
	}
	return f
}

// projectionBytesPerEntry is the heap a projection of n realistic entries
// holds, per entry.
func projectionBytesPerEntry(tb testing.TB, n int) float64 {
	before := heapAlloc()
	p, err := FromFold(testNames, foldRealistic(tb, n))
	if err != nil {
		tb.Fatal(err)
	}
	after := heapAlloc()
	if p.Len() != n {
		tb.Fatalf("%d entries, want %d", p.Len(), n)
	}
	runtime.KeepAlive(p)
	return float64(int64(after)-int64(before)) / float64(n)
}

// TestProjectionMemoryPerEntry holds the projection to its budget of 1 KiB
// per entry, with entries of a realistic shape (realisticEntry).
// CRONSTREAM_MEMORY_ENTRIES sets how many (default 20,000;
// BenchmarkProjectionMemory measures 100,000).
func TestProjectionMemoryPerEntry(t *testing.T) {
	// Not parallel: the heap it measures must hold nothing of other tests.
	n := 20_000
	if v := os.Getenv("CRONSTREAM_MEMORY_ENTRIES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("CRONSTREAM_MEMORY_ENTRIES=%q: want a positive number", v)
		}
	}
	per := projectionBytesPerEntry(t, n)
	t.Logf("projection of %d realistic entries: %.0f bytes of heap per entry", n, per)
	if per > maxBytesPerEntry {
		t.Errorf("projection holds %.0f bytes per entry, over the budget of %d", per, maxBytesPerEntry)
	}
}

// BenchmarkProjectionMemory reports the heap a projection holds per entry
// (heap-bytes/entry), for 100,000 entries of a realistic shape.
func BenchmarkProjectionMemory(b *testing.B) {
	var per float64
	for b.Loop() {
		per += projectionBytesPerEntry(b, 100_000)
	}
	b.ReportMetric(per/float64(b.N), "heap-bytes/entry")
}
