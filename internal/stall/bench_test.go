package stall

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
)

// BenchmarkCheck100k is one full check of 100,000 entries in 10 queues,
// every watermark read (the detector's first check; later ones read only
// the entries that look late): the MGETs and the due computation.
func BenchmarkCheck100k(b *testing.B) {
	r := testenv.StartRedis(b)
	store := taskstate.New(r.Client(b))
	names := events.MustNames("stallbench")
	reg := time.Now().Add(-time.Hour)
	entries := make([]projector.State, 100_000)
	for i := range entries {
		e := events.Entry{ID: "e" + strconv.Itoa(i), Cron: "@every 1s", Task: events.Task{Type: "t"},
			Options: events.Options{Queue: "q" + strconv.Itoa(i%10)}}
		entries[i] = projector.State{Entry: e.Normalize(), Revision: 1, Time: reg}
	}
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		late, err := Check(ctx, store, names, entries, time.Now(), DefaultLateAfter)
		if err != nil {
			b.Fatal(err)
		}
		if len(late) != len(entries) {
			b.Fatalf("%d late, want all", len(late))
		}
	}
}

// BenchmarkTrack100k is the in-memory part of a check of 100,000 entries
// whose watermarks are known: what every check costs in steady state.
func BenchmarkTrack100k(b *testing.B) {
	now := time.Now()
	tracks := make([]*track, 100_000)
	for i := range tracks {
		e := events.Entry{ID: "e" + strconv.Itoa(i), Cron: "@every 1s", Task: events.Task{Type: "t"}}
		tracks[i] = newTrack(projector.State{Entry: e.Normalize(), Revision: 1, Time: now.Add(-time.Hour)})
		tracks[i].wm, tracks[i].hasWM, tracks[i].known = now.Add(-time.Duration(i%3)*time.Second), true, true
	}
	b.ResetTimer()
	for b.Loop() {
		n := 0
		for _, t := range tracks {
			if _, over, ok := t.lateness(now, time.Time{}); ok && over > DefaultLateAfter {
				n++
			}
		}
		if n != 0 {
			b.Fatalf("%d late", n)
		}
	}
}
