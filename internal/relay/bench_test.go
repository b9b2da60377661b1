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
// after its acknowledgements) and with the default BatchesPerPass, in the
// same run. A CPU profile of it
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
// shape=single, each iteration writes one fire for a relay that does not
// wait and one for a relay that waits for the replica (two tenants, so
// neither takes the other's outbox), outside the timer, and times one Pass
// of each: one WAIT per fire, the steady state of a replica whose fires
// come one at a time, both measured under the same load. µs/fire is a
// pass's time.
//
//	go test -run '^$' -bench 'BenchmarkRelayWait/shape=single' -benchtime 2000x ./internal/relay/
//	go test -run '^$' -bench 'BenchmarkRelayWait/shape=drain' -benchtime 3x ./internal/relay/
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
	b.Run("shape=single", func(b *testing.B) {
		e.t = b
		waitSingle(b, e.env)
	})
}

// waitRelay is a relay on e's tenant nm waiting for wait replicas,
// stopped at b's end.
func waitRelay(b *testing.B, e *env, nm events.Names, wait int) *relay.Relay {
	js, err := jetstream.New(e.nats.Connect(b, nats.Name("bench")))
	if err != nil {
		b.Fatal(err)
	}
	r, err := relay.New(relay.Config{Outbox: e.store, JS: js, Names: nm, Owner: "bench", Logger: logger(b), WaitReplicas: wait})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

func waitDrain(b *testing.B, e *env, queue string, n, wait int) {
	r := waitRelay(b, e, names, wait)
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

func waitSingle(b *testing.B, e *env) {
	c := ctx(b, 10*time.Minute)
	waited := events.MustNames("rlwait")
	if err := events.EnsureStreams(c, e.js, events.StreamConfig{Names: waited}); err != nil {
		b.Fatal(err)
	}
	plain, confirmed := waitRelay(b, e, names, 0), waitRelay(b, e, waited, 1)
	var elapsed [2]time.Duration
	for i := range b.N {
		for k, r := range []*relay.Relay{plain, confirmed} {
			b.StopTimer()
			nm := names
			if k == 1 {
				nm = waited
			}
			e.writeOne(nm.Prefix(), "single")
			b.StartTimer()
			start := time.Now()
			n, err := r.Pass(c)
			elapsed[k] += time.Since(start)
			if err != nil || n != 1 {
				b.Fatalf("relay %d: pass %d published %d, %v; want 1 (backlog %d)", k, i, n, err, r.Backlog())
			}
		}
	}
	b.StopTimer()
	checkConfirmed(b, confirmed)
	b.ReportMetric(float64(elapsed[0].Microseconds())/float64(b.N), "µs/fire-nowait")
	b.ReportMetric(float64(elapsed[1].Microseconds())/float64(b.N), "µs/fire-wait")
	b.ReportMetric(float64((elapsed[1]-elapsed[0]).Microseconds())/float64(b.N), "µs/fire-wait-cost")
}

// writeOne writes one scheduled fire of tenant p into queue's outbox.
func (e *env) writeOne(p, queue string) {
	e.n++
	tick := time.Unix(1_700_000_000+int64(e.n), 0).UTC()
	taskID := fmt.Sprintf("%s:one:%d", p, e.n)
	fired := events.Fired{Entry: "one", ScheduledAt: tick, EnqueuedAt: time.Now().UTC(), TaskID: taskID, Queue: queue, Revision: 1, Replica: "bench"}
	f := taskstate.Fire{Prefix: p, Entry: "one", Queue: queue, Kind: taskstate.FireBackfill, Tick: tick,
		Msg:         &taskstate.TaskMessage{Type: "t", ID: taskID},
		FiredRecord: taskstate.Record{ID: events.FiredEventID("one", tick), Data: outbox.AppendFiredRecord(nil, &fired)}}
	if _, err := e.store.FireBatch(ctx(e.t, time.Minute), taskstate.Fences{}, []taskstate.Fire{f}); err != nil {
		e.t.Fatal(err)
	}
}

// checkConfirmed fails b when r published anything unconfirmed.
func checkConfirmed(b *testing.B, r *relay.Relay) {
	if st := r.WaitStatus(); st.Unconfirmed != 0 || st.Behind {
		b.Fatalf("events published unconfirmed: %+v", st)
	}
}
