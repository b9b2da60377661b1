package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cronstream/cronstream/internal/clock"
)

// Stream reads on the firing loop (docs/design.md INV-staleness-fence). The
// loop reads the streams through History while it loads watermarks and
// checks epochs, and fires nothing while it waits. With NATS unreachable,
// or back without a JetStream leader (a whole cluster restarting), every
// read would wait out the client's request timeout, as long as the grace:
// a replica loading its watermarks when NATS went away held every tick past
// the grace, one read after another, and those ticks were skipped as
// missed. So each read is bounded by streamReadTimeout, and after one fails
// the streams count as unavailable for streamReadPause: reads fail at once
// with errStreamsUnavailable, and their callers go on with what Redis and
// this replica know, as they do on any failed read. A read while the NATS
// connection is known to be down fails at once, without waiting out the
// bound: a loop that waited streamReadTimeout on each read after every pause
// through a long outage held its ticks and, past the ownership's progress
// bound, stopped renewing its shard leases.
const (
	streamReadTimeout = 2 * time.Second
	streamReadPause   = 3 * time.Second
)

// errStreamsUnavailable: a stream read failed within streamReadPause; the
// streams are not asked again yet.
var errStreamsUnavailable = errors.New("stream reads paused after a failed read (NATS unreachable or JetStream unavailable)")

// boundedHistory is the History the loop reads: each read bounded, and none
// tried for a while after one failed. Loop goroutine only.
type boundedHistory struct {
	h     History
	clock *clock.Clock
	log   *slog.Logger
	// pausedUntil: reads fail at once before it (zero: never failed).
	pausedUntil clock.Mono
	paused      bool
}

// errNotConnected: the History's NATS connection is down.
var errNotConnected = errors.New("not connected to NATS")

// connectedHistory is a History that knows whether its NATS connection is
// up (StreamHistory).
type connectedHistory interface {
	Connected() bool
}

func (b *boundedHistory) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if b.paused && b.clock.Until(b.pausedUntil) > 0 {
		return nil, nil, errStreamsUnavailable
	}
	if c, ok := b.h.(connectedHistory); ok && !c.Connected() {
		b.failed(errNotConnected)
		return nil, nil, errStreamsUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, streamReadTimeout)
	return ctx, cancel, nil
}

// end records the read's outcome: a failure (not the loop's own stop)
// pauses the reads.
func (b *boundedHistory) end(parent context.Context, cancel context.CancelFunc, err error) error {
	cancel()
	switch {
	case err == nil:
		b.paused = false
	case parent.Err() == nil:
		b.failed(err)
	}
	return err
}

// failed pauses the reads after a failure, saying so when they were not
// paused already.
func (b *boundedHistory) failed(err error) {
	if !b.paused {
		b.log.Warn("a config or activity stream read failed: no stream reads for a while, firing on what Redis and this replica know", "pause", streamReadPause, "err", err)
	}
	b.paused, b.pausedUntil = true, b.clock.Mono().Add(streamReadPause)
}

func (b *boundedHistory) EventCounts(ctx context.Context) (map[string]uint64, uint64, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("config event counts: %w", err)
	}
	counts, asOf, err := b.h.EventCounts(rctx)
	return counts, asOf, b.end(ctx, cancel, err)
}

func (b *boundedHistory) PreviousQueues(ctx context.Context, entry string) ([]string, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("previous queues of %s: %w", entry, err)
	}
	q, err := b.h.PreviousQueues(rctx, entry)
	return q, b.end(ctx, cancel, err)
}

func (b *boundedHistory) FiredEntries(ctx context.Context) (map[string]bool, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("fired entries: %w", err)
	}
	fired, err := b.h.FiredEntries(rctx)
	return fired, b.end(ctx, cancel, err)
}

func (b *boundedHistory) LastHandledAll(ctx context.Context) (map[string]time.Time, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("last handled ticks: %w", err)
	}
	last, err := b.h.LastHandledAll(rctx)
	return last, b.end(ctx, cancel, err)
}

func (b *boundedHistory) LastHandled(ctx context.Context, entry string) (time.Time, string, bool, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("last handled tick of %s: %w", entry, err)
	}
	tick, task, ok, err := b.h.LastHandled(rctx, entry)
	return tick, task, ok, b.end(ctx, cancel, err)
}

func (b *boundedHistory) ScheduleStart(ctx context.Context, entry string) (ScheduleStart, bool, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return ScheduleStart{}, false, fmt.Errorf("schedule of %s: %w", entry, err)
	}
	start, ok, err := b.h.ScheduleStart(rctx, entry)
	return start, ok, b.end(ctx, cancel, err)
}

func (b *boundedHistory) StopSince(ctx context.Context, entry string, upTo uint64) (StopSpan, bool, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return StopSpan{}, false, fmt.Errorf("pause or removal of %s: %w", entry, err)
	}
	span, ok, err := b.h.StopSince(rctx, entry, upTo)
	return span, ok, b.end(ctx, cancel, err)
}

func (b *boundedHistory) ConfigMessageAt(ctx context.Context, seq uint64) (string, string, bool, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return "", "", false, fmt.Errorf("config message at %d: %w", seq, err)
	}
	subject, id, found, err := b.h.ConfigMessageAt(rctx, seq)
	return subject, id, found, b.end(ctx, cancel, err)
}

// FiredSince is bounded like the other reads although it may read the
// whole of one entry's fire subject: a rebuild that cannot finish in time
// leaves only that entry unfired (late, so the detector shows it) and is
// tried again, where an unbounded read would stop the loop.
func (b *boundedHistory) FiredSince(ctx context.Context, entry string, since uint64) (FireTally, error) {
	rctx, cancel, err := b.begin(ctx)
	if err != nil {
		return FireTally{}, fmt.Errorf("fires since revision %d: %w", since, err)
	}
	t, err := b.h.FiredSince(rctx, entry, since)
	return t, b.end(ctx, cancel, err)
}
