package projector

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/testenv"
)

// Benchmark size: CRONSTREAM_BENCH_ENTRIES entries (default 100,000) with
// benchEventsPerEntry config events each.
const benchEventsPerEntry = 10

func benchEntries(b *testing.B) int {
	if v := os.Getenv("CRONSTREAM_BENCH_ENTRIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("CRONSTREAM_BENCH_ENTRIES=%q: want a positive integer", v)
		}
		return n
	}
	return 100_000
}

// benchEntry is a plausible entry: mostly UTC, some other zones, a small JSON
// payload, headers on some.
func benchEntry(i, round int) events.Entry {
	e := events.Entry{
		ID:       fmt.Sprintf("entry-%06d", i),
		Cron:     crons[(i+round)%len(crons)],
		Timezone: []string{"UTC", "UTC", "UTC", "UTC", "Europe/Berlin"}[i%5],
		Task: events.Task{
			Type:    fmt.Sprintf("report:%d", i%50),
			Payload: []byte(fmt.Sprintf(`{"tenant":%d,"round":%d,"format":"pdf"}`, i, round)),
		},
		Options: events.Options{Queue: queues[i%len(queues)], Timeout: events.Duration(10 * time.Minute)},
		Owner:   "sync",
	}
	if i%3 == 0 {
		e.Task.Headers = map[string]string{"source": "cron", "team": "ops"}
	}
	return e.Normalize()
}

// benchEvent is round's event of entry i: registered, then updates with a
// pause and a resume among them, so every type is in the history.
func benchEvent(b *testing.B, i, round int) []byte {
	e := benchEntry(i, round)
	typ := events.TypeEntryUpdated
	switch round {
	case 0:
		typ = events.TypeEntryRegistered
	case 4:
		typ, e.Paused = events.TypeEntryPaused, true
	case 5:
		typ = events.TypeEntryResumed
	}
	data := eventtest.Marshal(b, typ, "bench", e.ID, e)
	return data
}

// benchPublishWindow is how many async publishes are in flight at most.
const benchPublishWindow = 16_384

// buildBenchStream publishes entries × benchEventsPerEntry events with async
// publishes in large windows, round by round, so each entry's history is
// spread over the whole stream.
func buildBenchStream(b *testing.B, js jetstream.JetStream, entries int) (uint64, int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	var bytes int64
	pending := 0
	flush := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("async publishes not acknowledged")
		}
		pending = 0
	}
	for round := range benchEventsPerEntry {
		for i := range entries {
			data := benchEvent(b, i, round)
			bytes += int64(len(data))
			if _, err := js.PublishAsync(testNames.ConfigSubject(fmt.Sprintf("entry-%06d", i)), data); err != nil {
				b.Fatalf("publish: %v", err)
			}
			if pending++; pending == benchPublishWindow {
				flush()
			}
		}
	}
	flush()
	s, err := js.Stream(ctx, testNames.ConfigStream())
	if err != nil {
		b.Fatal(err)
	}
	return s.CachedInfo().State.LastSeq, bytes
}

// rawRead reads n messages with a bare ordered consumer, with the same pull
// batch as the projector, doing nothing with them: the floor for any reader.
func rawRead(b *testing.B, js jetstream.JetStream, policy jetstream.DeliverPolicy, n int) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	start := time.Now()
	cons, err := js.OrderedConsumer(ctx, testNames.ConfigStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{testNames.ConfigFilter()},
		DeliverPolicy:  policy,
	})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(pullBatch))
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	for range n {
		if _, err := it.Next(jetstream.NextContext(ctx)); err != nil {
			b.Fatalf("raw read: %v", err)
		}
	}
	return time.Since(start)
}

// cpuTime is the CPU time the process has used, the embedded server's
// included: on a shared machine it says more than the wall clock about what
// a measured step costs.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// timed runs f and returns its wall and CPU time.
func timed(b *testing.B, f func()) (wall, cpu time.Duration) {
	c0, t0 := cpuTime(b), time.Now()
	f()
	return time.Since(t0), cpuTime(b) - c0
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkProjector builds one config stream once per run (its
// sub-benchmarks share it; run with -count=1 and repeat with -benchtime=Nx)
// and measures on it:
//
//   - ColdStart: a bare ordered consumer reading the last message per
//     subject, then a projector from New to caught up; reports both and
//     their ratio (goal ≤ 2).
//   - Memory: heap held by a caught-up projection per entry.
//   - AsOf: a bare ordered consumer reading the whole history, then
//     AsOfSeq over the whole history; reports both in events/s and the
//     ratio (goal ≥ 0.5).
func BenchmarkProjector(b *testing.B) {
	entries := benchEntries(b)
	n := testenv.StartNATS(b)
	js := n.JetStream(b)
	setupStreams(b, js, 1)
	start := time.Now()
	pub, err := jetstream.New(n.Connect(b), jetstream.WithPublishAsyncMaxPending(benchPublishWindow))
	if err != nil {
		b.Fatal(err)
	}
	total, bytes := buildBenchStream(b, pub, entries)
	b.Logf("built %d events (%d entries × %d, %.0f MB of events) in %s",
		total, entries, benchEventsPerEntry, float64(bytes)/1e6, time.Since(start).Round(time.Millisecond))
	quiet := Config{JS: js, Names: testNames, Logger: testLogger(b)}

	b.Run("ColdStart", func(b *testing.B) {
		var raw, rawCPU, proj, projCPU time.Duration
		for b.Loop() {
			w, c := timed(b, func() { rawRead(b, js, jetstream.DeliverLastPerSubjectPolicy, entries) })
			raw, rawCPU = raw+w, rawCPU+c
			var p *Projector
			w, c = timed(b, func() {
				p = mustNew(b, quiet)
				if err := p.Start(context.Background()); err != nil {
					b.Fatal(err)
				}
				if err := p.WaitCaughtUp(context.Background()); err != nil {
					b.Fatal(err)
				}
			})
			proj, projCPU = proj+w, projCPU+c
			if p.Len() != entries {
				b.Fatalf("%d entries, want %d", p.Len(), entries)
			}
			_ = p.Stop(context.Background())
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(b.N) }
		b.ReportMetric(ms(raw), "raw-ms/op")
		b.ReportMetric(ms(proj), "projector-ms/op")
		b.ReportMetric(float64(proj)/float64(raw), "projector/raw")
		b.ReportMetric(ms(rawCPU), "raw-cpu-ms/op")
		b.ReportMetric(ms(projCPU), "projector-cpu-ms/op")
		b.ReportMetric(float64(entries)*float64(b.N)/proj.Seconds(), "entries/s")
	})

	b.Run("Memory", func(b *testing.B) {
		var perEntry float64
		for b.Loop() {
			p := mustNew(b, quiet)
			if err := p.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			if err := p.WaitCaughtUp(context.Background()); err != nil {
				b.Fatal(err)
			}
			_ = p.Stop(context.Background())
			loaded := heapAlloc()
			runtime.KeepAlive(p)
			p = nil
			perEntry += float64(int64(loaded)-int64(heapAlloc())) / float64(entries)
		}
		b.ReportMetric(perEntry/float64(b.N), "heap-bytes/entry")
	})

	b.Run("AsOf", func(b *testing.B) {
		var raw, rawCPU, asOf, asOfCPU time.Duration
		for b.Loop() {
			w, c := timed(b, func() { rawRead(b, js, jetstream.DeliverAllPolicy, int(total)) })
			raw, rawCPU = raw+w, rawCPU+c
			var m map[string]State
			w, c = timed(b, func() {
				var err error
				if m, _, err = AsOfSeq(context.Background(), js, testNames, math.MaxUint64); err != nil {
					b.Fatal(err)
				}
			})
			asOf, asOfCPU = asOf+w, asOfCPU+c
			if len(m) != entries {
				b.Fatalf("%d entries, want %d", len(m), entries)
			}
		}
		rate := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() }
		b.ReportMetric(rate(raw), "raw-events/s")
		b.ReportMetric(rate(asOf), "asof-events/s")
		b.ReportMetric(float64(raw)/float64(asOf), "asof/raw")
		b.ReportMetric(rate(rawCPU), "raw-events/cpu-s")
		b.ReportMetric(rate(asOfCPU), "asof-events/cpu-s")
	})
}

// BenchmarkDecode is the per-event cost of the fold's decode and checks, and
// of its two parts in the events package (JSON decoding, validation), for an
// entry in UTC and one in another zone.
func BenchmarkDecode(b *testing.B) {
	for _, tc := range []struct {
		name string
		i    int
	}{{"UTC", 0}, {"Berlin", 4}} {
		data := benchEvent(b, tc.i, 1)
		subject := testNames.ConfigSubject(benchEntry(tc.i, 1).ID)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if d := decode(testNames, message{subject: subject, seq: 1, data: data}); d.bad != nil {
					b.Fatal(d.bad)
				}
			}
		})
		b.Run(tc.name+"/json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ev, err := events.DecodeEvent(data)
				if err != nil {
					b.Fatal(err)
				}
				var e events.Entry
				if err := ev.DecodeData(&e); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/validate", func(b *testing.B) {
			ev, err := events.DecodeEvent(data)
			if err != nil {
				b.Fatal(err)
			}
			var e events.Entry
			if err := ev.DecodeData(&e); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := e.Validate(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
