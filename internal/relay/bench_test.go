package relay_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// writeFired appends n fired records in the compact form of a scheduled
// tick (as the scheduler writes them) to queue's outbox, spread over
// entries entries, through the fire script.
func (e *env) writeFired(queue string, entries, n int) {
	e.t.Helper()
	now := time.Now().UTC()
	const chunk = 2000
	fires := make([]taskstate.Fire, 0, chunk)
	for done := 0; done < n; {
		fires = fires[:0]
		for ; len(fires) < chunk && done < n; done++ {
			e.n++
			entry := "e" + strconv.Itoa(e.n%entries)
			tick := time.Unix(1_700_000_000+int64(e.n), 0).UTC()
			taskID := fmt.Sprintf("%s:%s:%d", prefix, entry, e.n)
			fired := events.Fired{Entry: entry, ScheduledAt: tick, EnqueuedAt: now, TaskID: taskID, Queue: queue, Revision: uint64(e.n), Replica: "bench"}
			fires = append(fires, taskstate.Fire{
				Prefix: prefix, Entry: entry, Queue: queue, Kind: taskstate.FireBackfill, Tick: tick,
				Msg:         &taskstate.TaskMessage{Type: "t", ID: taskID},
				FiredRecord: taskstate.Record{ID: fmt.Sprintf("fire:%s:%d", entry, tick.Unix()), Data: outbox.AppendFiredRecord(nil, &fired)},
			})
		}
		if _, err := e.store.FireBatch(ctx(e.t, time.Minute), taskstate.Fences{}, fires); err != nil {
			e.t.Fatal(err)
		}
	}
}

// BenchmarkRelayDrain measures how fast one relay empties an outbox of
// fired records into the activity stream (real redis-server, embedded
// nats-server with the product's stream configuration): the records are
// written first, outside the timer, then Flush publishes them all. It
// reports events/s with one batch per pass (each batch's Redis round trips
// after its acknowledgements, as the relay once published) and with the
// default BatchesPerPass, in the same run. A CPU profile of it
// (-cpuprofile) shows the relay's cost per event beside the embedded
// server's.
//
//	CRONSTREAM_BENCH_RECORDS=100000 go test -run '^$' -bench BenchmarkRelayDrain -benchtime 1x ./internal/relay/
//
// CRONSTREAM_BENCH_RECORDS is the number of records per run (default
// 20,000), spread over 10,000 entries.
func BenchmarkRelayDrain(b *testing.B) {
	n := 20_000
	if v, err := strconv.Atoi(os.Getenv("CRONSTREAM_BENCH_RECORDS")); err == nil && v > 0 {
		n = v
	}
	for _, k := range []int{1, 0} {
		name := "batches-per-pass=default"
		if k > 0 {
			name = fmt.Sprintf("batches-per-pass=%d", k)
		}
		b.Run(name, func(b *testing.B) { drain(b, n, func(c *relay.Config) { c.BatchesPerPass = k }) })
	}
}

func drain(b *testing.B, n int, mod func(*relay.Config)) {
	e := newEnv(b, 0)
	js, err := jetstream.New(e.nats.Connect(b, nats.Name("bench")))
	if err != nil {
		b.Fatal(err)
	}
	cfg := relay.Config{Outbox: e.store, JS: js, Names: names, Owner: "bench", Logger: logger(b)}
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Stop(context.Background()) })
	var elapsed time.Duration
	published := 0
	for range b.N {
		b.StopTimer()
		e.writeFired("default", 10_000, n)
		before := e.storedCount()
		b.StartTimer()
		start := time.Now()
		if err := r.Flush(ctx(b, 10*time.Minute)); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		if left := e.outboxLen("default"); left != 0 {
			b.Fatalf("%d records left in the outbox", left)
		}
		if got := e.storedCount() - before; got != uint64(n) {
			b.Fatalf("%d events stored, want %d", got, n)
		}
		published += n
	}
	b.ReportMetric(float64(published)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(published), "µs/event")
}

// BenchmarkRelayWait measures what waiting for a Redis replica (WAIT,
// Config.WaitReplicas) costs the relay, against a real redis-server
// primary with a real replica on this host and an embedded nats-server,
// with and without WAIT in the same run, on the same servers. In
// shape=drain, N fired records are written first, outside the timer, and
// one Flush publishes them: one WAIT per batch of up to 512. In
// shape=single, one fire is written (outside the timer) and one Pass
// publishes it: one WAIT per fire, the steady state of a replica whose
// fires come one at a time; µs/fire is the pass's time.
//
//	go test -run '^$' -bench BenchmarkRelayWait -benchtime 2000x ./internal/relay/
//
// CRONSTREAM_BENCH_RECORDS is the drain's number of records per run
// (default 20,000).
func BenchmarkRelayWait(b *testing.B) {
	n := 20_000
	if v, err := strconv.Atoi(os.Getenv("CRONSTREAM_BENCH_RECORDS")); err == nil && v > 0 {
		n = v
	}
	e := newReplicatedEnv(b)
	for _, wait := range []int{0, 1} {
		b.Run(fmt.Sprintf("shape=drain/wait=%d", wait), func(b *testing.B) {
			e.t = b
			waitDrain(b, e.env, fmt.Sprintf("drain-%d", wait), n, wait)
		})
	}
	for _, wait := range []int{0, 1} {
		b.Run(fmt.Sprintf("shape=single/wait=%d", wait), func(b *testing.B) {
			e.t = b
			waitSingle(b, e.env, fmt.Sprintf("single-%d", wait), wait)
		})
	}
}

// waitRelay is a relay on e waiting for wait replicas, stopped at b's end.
func waitRelay(b *testing.B, e *env, wait int) *relay.Relay {
	js, err := jetstream.New(e.nats.Connect(b, nats.Name("bench")))
	if err != nil {
		b.Fatal(err)
	}
	r, err := relay.New(relay.Config{Outbox: e.store, JS: js, Names: names, Owner: "bench", Logger: logger(b), WaitReplicas: wait})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

func waitDrain(b *testing.B, e *env, queue string, n, wait int) {
	r := waitRelay(b, e, wait)
	var elapsed time.Duration
	published := 0
	for range b.N {
		b.StopTimer()
		e.writeFired(queue, 10_000, n)
		b.StartTimer()
		start := time.Now()
		if err := r.Flush(ctx(b, 10*time.Minute)); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		if left := e.outboxLen(queue); left != 0 {
			b.Fatalf("%d records left in the outbox", left)
		}
		published += n
	}
	checkConfirmed(b, r)
	b.ReportMetric(float64(published)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(published), "µs/event")
}

func waitSingle(b *testing.B, e *env, queue string, wait int) {
	r := waitRelay(b, e, wait)
	c := ctx(b, 10*time.Minute)
	var elapsed time.Duration
	for range b.N {
		b.StopTimer()
		e.writeFired(queue, 1, 1)
		b.StartTimer()
		start := time.Now()
		n, err := r.Pass(c)
		elapsed += time.Since(start)
		if err != nil || n != 1 {
			b.Fatalf("pass published %d, %v; want 1", n, err)
		}
	}
	b.StopTimer()
	checkConfirmed(b, r)
	b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/fire")
}

// checkConfirmed fails b when r published anything unconfirmed.
func checkConfirmed(b *testing.B, r *relay.Relay) {
	if st := r.WaitStatus(); st.Unconfirmed != 0 || st.Behind {
		b.Fatalf("events published unconfirmed: %+v", st)
	}
}
