package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestStreamReadsBoundedWhileNATSDown: with NATS gone, a stream read of the
// firing loop fails at once once the client knows its connection is down
// (not after the client's 5 s, nor after streamReadTimeout), the reads
// after it fail at once, and once NATS is back and the pause over they
// succeed again.
func TestStreamReadsBoundedWhileNATSDown(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	names := events.MustNames("reads")
	ctx := context.Background()
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	b := &boundedHistory{h: NewStreamHistory(js, names), clock: clock.Local(), log: slog.New(slog.DiscardHandler)}
	if _, err := b.LastHandledAll(ctx); err != nil {
		t.Fatalf("read with NATS up: %v", err)
	}

	n.Shutdown()
	testenv.Eventually(t, 10*time.Second, func() bool { return !js.Conn().IsConnected() }, "the client to notice NATS is gone")
	began := time.Now()
	if _, err := b.LastHandledAll(ctx); !errors.Is(err, errStreamsUnavailable) {
		t.Fatalf("read with NATS down: %v, want errStreamsUnavailable", err)
	}
	// Known to be down: no wait for the bound.
	if took := time.Since(began); took > streamReadTimeout/4 {
		t.Errorf("a read while the connection is down took %s, want at once", took)
	}
	// A History that cannot tell (NATS reachable, JetStream not answering,
	// as in a cluster without a leader) waits out the bound, no longer.
	blind := &boundedHistory{h: struct{ History }{NewStreamHistory(js, names)}, clock: clock.Local(), log: slog.New(slog.DiscardHandler)}
	began = time.Now()
	if _, err := blind.LastHandledAll(ctx); err == nil {
		t.Fatal("read with NATS down succeeded")
	}
	if took := time.Since(began); took > streamReadTimeout+time.Second {
		t.Errorf("a read with NATS down took %s, want at most %s", took, streamReadTimeout)
	}
	began = time.Now()
	if _, _, err := b.EventCounts(ctx); !errors.Is(err, errStreamsUnavailable) {
		t.Errorf("read right after a failed one: %v, want errStreamsUnavailable", err)
	}
	if took := time.Since(began); took > 100*time.Millisecond {
		t.Errorf("a paused read took %s", took)
	}

	n.Restart(t)
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, err := b.LastHandledAll(ctx)
		return err == nil
	}, "reads to succeed again once NATS is back")
}

// TestScanHistory: behind reads the stream per entry for a takeover or
// handover of a small part of the entries, and in one pass otherwise.
func TestScanHistory(t *testing.T) {
	for _, c := range []struct {
		loading, known int
		scan           bool
	}{
		{1, 1, true},
		{33, 100, true}, // a third of the entries: the pass
		{12, 100, false},
		{470, 12_000, false}, // 20 of 512 shards taken over
		{1_500, 12_000, false},
		{1_501, 12_000, true},
		{12_000, 12_000, true},
	} {
		if got := scanHistory(c.loading, c.known); got != c.scan {
			t.Errorf("scanHistory(%d, %d) = %v, want %v", c.loading, c.known, got, c.scan)
		}
	}
}
