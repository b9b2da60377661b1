package streamclient

import (
	"strconv"
	"testing"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/eventtest"
)

// Run both together, e.g.:
//
//	go test -run '^$' -bench 'Put|RawPublish' -benchtime 2s -count 5 ./events
//
// and compare with benchstat: Put should reach at least half the raw rate.
// BenchmarkPut is one long-lived client (a replica, a sync loop): it
// remembers the state it wrote, so a put is one publish. A fresh client
// (a CLI call) reads first; BenchmarkPutFreshClient shows that cost.

// BenchmarkPut measures Client.Put with optimistic concurrency on: each
// operation changes one entry's content, so it reads the current state and
// publishes one event expecting that revision.
func BenchmarkPut(b *testing.B) {
	ctx := testCtx(b)
	_, _, c := newSingle(b, "bench")
	e := validEntry("bench-entry")
	if _, err := c.Put(ctx, e); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		i++
		e.Note = strconv.Itoa(i)
		r, err := c.Put(ctx, e)
		if err != nil {
			b.Fatal(err)
		}
		if r.Type != contract.TypeEntryUpdated {
			b.Fatalf("op %d published %q", i, r.Type)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkPutFreshClient is BenchmarkPut with a new Client per
// operation, as a CLI invocation would be: nothing remembered, so every
// put first reads the entry's last event (Direct Get).
func BenchmarkPutFreshClient(b *testing.B) {
	ctx := testCtx(b)
	_, js, c := newSingle(b, "bench")
	e := validEntry("bench-entry")
	if _, err := c.Put(ctx, e); err != nil {
		b.Fatal(err)
	}
	names := contract.MustNames("bench")
	i := 0
	for b.Loop() {
		i++
		e.Note = strconv.Itoa(i)
		r, err := NewClient(js, names).Put(ctx, e)
		if err != nil {
			b.Fatal(err)
		}
		if r.Type != contract.TypeEntryUpdated {
			b.Fatalf("op %d published %q", i, r.Type)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRawPublish is the floor Put is compared with: a plain
// synchronous JetStream publish of the same event bytes to the same
// subject, with no read, no msg id and no expected sequence.
func BenchmarkRawPublish(b *testing.B) {
	ctx := testCtx(b)
	_, js, _ := newSingle(b, "bench")
	e := validEntry("bench-entry").Normalize()
	e.Note = "123456"
	data := eventtest.Marshal(b, contract.TypeEntryUpdated, DefaultSource, e.ID, e)
	subject := contract.MustNames("bench").ConfigSubject(e.ID)
	for b.Loop() {
		if _, err := js.Publish(ctx, subject, data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
