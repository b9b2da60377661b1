package stall

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// fakeShards is an owned set a test moves.
type fakeShards struct {
	mu      sync.Mutex
	set     schedule.OwnedShards
	changed chan struct{}
}

func (f *fakeShards) Owned() schedule.OwnedShards {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.set
}

func (f *fakeShards) Changed() <-chan struct{} { return f.changed }

func (f *fakeShards) own(shards ...events.Shard) {
	f.mu.Lock()
	until := map[events.Shard]clock.Mono{}
	for _, s := range shards {
		until[s] = clock.Mono{}
	}
	f.set = schedule.OwnedShards{Version: f.set.Version + 1, Until: until}
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// TestDetectorTracksOwnedShards: with ownership a replica's detector
// tracks and checks the entries of the shards it owns only (their owner
// checks the others, and ownership reports shards without one), so its
// work is its share: of 40 late entries in two queues only those of the
// owned shard are tracked and late; a shard taken is tracked from a
// snapshot of the projection and checked at once, a shard given up
// forgotten.
func TestDetectorTracksOwnedShards(t *testing.T) {
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	store := taskstate.New(testenv.StartRedis(t).Client(t))
	names := events.MustNames("stallown")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	client := events.NewClient(js, names)
	var last uint64
	shardOf := map[string]events.Shard{}
	for i := range 40 {
		id, q := fmt.Sprintf("e%02d", i), []string{"mine", "theirs"}[i%2]
		res, err := client.Put(ctx, events.Entry{ID: id, Cron: "@every 1s", Task: events.Task{Type: "t"}, Options: events.Options{Queue: q}})
		if err != nil {
			t.Fatal(err)
		}
		last, shardOf[id] = res.Revision, events.ShardOfEntry(q, id)
	}
	proj, err := projector.New(projector.Config{JS: js, Names: names, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proj.Stop(ctx) })
	if err := proj.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}
	a, b := shardOf["e00"], shardOf["e01"] // one shard of each queue
	inShard := func(s events.Shard) []string {
		var ids []string
		for id, sh := range shardOf {
			if sh == s {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		return ids
	}
	// Nothing fires: a minute on, every entry is late by the clock.
	var offset atomic.Int64
	metrics := NewMetrics(nil)
	shards := &fakeShards{changed: make(chan struct{}, 1)}
	shards.own(a)
	d, err := New(Config{Watermarks: store, Projection: proj, Names: names, LateAfter: 10 * time.Second, Interval: 100 * time.Millisecond,
		Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }, Shards: shards, Metrics: metrics,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(ctx) })
	offset.Store(int64(time.Minute))
	lateIs := func(want []string, why string) {
		t.Helper()
		var got []string
		testenv.Eventually(t, 10*time.Second, func() bool {
			got = got[:0]
			for _, l := range d.Late(0) {
				got = append(got, l.Entry)
			}
			slices.Sort(got)
			var m dto.Metric
			_ = metrics.Tracked.Write(&m)
			return slices.Equal(got, want) && int(m.GetGauge().GetValue()) == len(want)
		}, "%s: late %v, want %v (the entries of the owned shards, each tracked)", why, lazyList{&got}, want)
	}
	lateIs(inShard(a), "one shard owned")
	shards.own(a, b)
	lateIs(slices.Sorted(slices.Values(append(inShard(a), inShard(b)...))), "a second shard taken")
	shards.own(b)
	lateIs(inShard(b), "the first shard given up")
}

type lazyList struct{ s *[]string }

func (l lazyList) String() string { return fmt.Sprint(*l.s) }
