package console

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/projectiontest"
	"github.com/cronstream/cronstream/internal/testenv"
)

var (
	benchCrons  = []string{"* * * * *", "*/5 * * * *", "0 9 * * 1-5", "@every 30s", "@daily", "30 */2 * * *", "@every 10m", "0 0 * * *"}
	benchQueues = []string{"default", "critical", "reports", "billing", "low"}
)

// benchEntry is a plausible entry; one in ten has jitter.
func benchEntry(i, round int) events.Entry {
	e := events.Entry{
		ID:      fmt.Sprintf("entry-%06d", i),
		Cron:    benchCrons[(i+round)%len(benchCrons)],
		Task:    events.Task{Type: fmt.Sprintf("report:%d", i%50), Payload: []byte(fmt.Sprintf(`{"tenant":%d}`, i))},
		Options: events.Options{Queue: benchQueues[i%len(benchQueues)]},
		Owner:   fmt.Sprintf("team-%d", i%20),
	}
	if i%10 == 0 {
		e.Jitter = events.Duration(5 * time.Minute)
	}
	if i%7 == 0 {
		e.Timezone = "Europe/Berlin"
	}
	return e.Normalize()
}

// BenchmarkConsole measures the server time of the console's pages on a
// projection of 100,000 entries with two config events each (registered,
// updated), read from a real NATS stream: the Entries page (filtered and
// paged), the Forecast page (computed afresh each time, as after any config
// change or at each new minute), and Time travel (a fold of the whole
// history to a moment). Each reports ms/page; the goal is under 300 ms for
// the Entries and Forecast pages. EntriesAfterChange is the first page
// after a config change, which reads and sorts the projection (Projector.States);
// ForecastCached is any later one in the same minute.
func BenchmarkConsole(b *testing.B) {
	const entries = 100_000
	ns := testenv.StartNATS(b)
	names := events.MustNames("bench")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	js := ns.JetStream(b)
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names, Replicas: 1}); err != nil {
		b.Fatal(err)
	}
	pub, err := jetstream.New(ns.Connect(b), jetstream.WithPublishAsyncMaxPending(16_384))
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for round, typ := range []string{events.TypeEntryRegistered, events.TypeEntryUpdated} {
		batch := make([]events.Entry, entries)
		for i := range batch {
			batch[i] = benchEntry(i, round)
		}
		eventtest.Publish(b, pub, names, typ, "bench", batch, time.Minute)
	}
	b.Logf("published %d config events in %s", 2*entries, time.Since(start).Round(time.Millisecond))
	proj := projectiontest.CaughtUp(ctx, b, js, names)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if proj.Len() != entries {
		b.Fatalf("projection holds %d entries, want %d", proj.Len(), entries)
	}
	c, err := New(Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	c.Attach(Source{Names: names, JS: js, Entries: proj.States, LastSeq: proj.LastSeq})

	serve := func(b *testing.B, path string, before func()) {
		b.Helper()
		var total time.Duration
		for b.Loop() {
			if before != nil {
				before()
			}
			req := httptest.NewRequest(http.MethodGet, path, nil)
			rec := httptest.NewRecorder()
			t0 := time.Now()
			c.ServeHTTP(rec, req)
			total += time.Since(t0)
			if rec.Code != http.StatusOK {
				b.Fatalf("GET %s: %d\n%.2000s", path, rec.Code, rec.Body.String())
			}
		}
		b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/page")
	}
	c.entriesOf(c.src.Load()) // the snapshot of this revision
	b.Run("Entries", func(b *testing.B) { serve(b, "/entries?offset=5000", nil) })
	b.Run("EntriesAfterChange", func(b *testing.B) {
		serve(b, "/entries?offset=5000", func() {
			c.snapMu.Lock()
			c.snap = nil
			c.snapMu.Unlock()
		})
	})
	b.Run("EntriesFiltered", func(b *testing.B) { serve(b, "/entries?queue=critical&state=active&type=report%3A1&offset=100", nil) })
	b.Run("Forecast", func(b *testing.B) {
		serve(b, "/forecast", func() {
			c.fcMu.Lock()
			clear(c.fcCache)
			c.fcMu.Unlock()
		})
	})
	b.Run("ForecastCached", func(b *testing.B) { serve(b, "/forecast", nil) })
	b.Run("TimeTravel", func(b *testing.B) {
		serve(b, "/timetravel?at="+url.QueryEscape(time.Now().UTC().Format(time.RFC3339Nano)), nil)
	})
}
