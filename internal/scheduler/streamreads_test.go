package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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

// gatedHistory holds its reads of last fires until open is closed: a
// stream read that takes as long as the test says.
type gatedHistory struct {
	History
	open chan struct{}
}

func (g gatedHistory) wait(ctx context.Context) error {
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g gatedHistory) LastHandled(ctx context.Context, entry string) (time.Time, string, bool, error) {
	if err := g.wait(ctx); err != nil {
		return time.Time{}, "", false, err
	}
	return g.History.LastHandled(ctx, entry)
}

func (g gatedHistory) LastHandledAll(ctx context.Context) (map[string]time.Time, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	return g.History.LastHandledAll(ctx)
}

// gatedScheduler is a scheduler built without running whose stream reads
// of last fires go through a gate on h, stopped with the test.
func gatedScheduler(t *testing.T, h History) (*Scheduler, gatedHistory) {
	gate := gatedHistory{History: h, open: make(chan struct{})}
	s := planScheduler()
	s.log = slog.New(slog.DiscardHandler)
	s.bounded = &boundedHistory{h: gate, clock: s.clock, log: s.log}
	s.cfg.History = s.bounded
	s.wake = make(chan struct{}, 1)
	s.entries = map[string]*entryRun{}
	t.Cleanup(func() { s.life.Stop() })
	return s, gate
}

// TestLastFiresOffTheLoop: the check of a loaded watermark against the
// activity stream, per entry and in one pass, does not wait on the loop:
// behind answers "wait" at once while the read runs, the read wakes the
// loop when it ends, and its answer then says whether the watermark is
// behind the stream's last fire. A read that fails (held past its bound)
// leaves the entry to load on its watermark unchecked, counted.
func TestLastFiresOffTheLoop(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	names := events.MustNames("lastfires")
	ctx := testenv.Context(t, time.Minute)
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	publishFire := func(tick time.Time) {
		t.Helper()
		task := fmt.Sprint("t", tick.Unix())
		ev, err := events.NewEventAt("fire:e1:"+task, tick, events.TypeEntryFired, "test", "e1", events.Fired{Entry: "e1", ScheduledAt: tick, EnqueuedAt: tick, TaskID: task, Queue: "default"})
		if err != nil {
			t.Fatal(err)
		}
		data, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, names.FireSubject("e1"), data); err != nil {
			t.Fatal(err)
		}
	}
	fired := time.Now().Add(-3 * time.Second).Truncate(time.Second)
	publishFire(fired)

	for _, scan := range []bool{false, true} {
		t.Run(fmt.Sprintf("scan=%v", scan), func(t *testing.T) {
			s, gate := gatedScheduler(t, NewStreamHistory(js, names))
			r := planEntry(t, "@every 1s", time.Time{})
			others := 20 // a pass for a load of 1 of 1; a read per entry for 1 of 21
			if !scan {
				for i := range others {
					s.entries[fmt.Sprint("x", i)] = &entryRun{}
				}
			}
			s.entries[r.id] = r
			if scanHistory(1, len(s.entries)) != scan {
				t.Fatalf("scanHistory(1, %d) != %v", len(s.entries), scan)
			}
			wm := fired.Add(-time.Second)
			behind, wait := s.behind(ctx, r, wm, time.Now(), 1)
			if behind || !wait {
				t.Fatalf("behind = %v, wait = %v while the read is held, want wait", behind, wait)
			}
			close(gate.open)
			select {
			case <-s.wake:
			case <-time.After(10 * time.Second):
				t.Fatal("the read did not wake the loop")
			}
			if behind, wait := s.behind(ctx, r, wm, time.Now(), 1); !behind || wait {
				t.Fatalf("behind = %v, wait = %v once read, want behind (the stream's last fire %s is after the watermark %s)", behind, wait, fired.Format(time.TimeOnly), wm.Format(time.TimeOnly))
			}
			if behind, _ := s.behind(ctx, r, fired, time.Now(), 1); behind {
				t.Fatal("a watermark at the stream's last fire counted as behind")
			}
		})
	}

	// A Redis rolled back at a failover: the stream holds a fire the
	// watermark lost, published after the last read. The next load must
	// not be answered by that read, or it fires the tick again.
	t.Run("a read from before the load does not answer it", func(t *testing.T) {
		s, gate := gatedScheduler(t, NewStreamHistory(js, names))
		close(gate.open)
		first := planEntry(t, "@every 1s", time.Time{})
		s.entries[first.id] = first
		if _, wait := s.behind(ctx, first, fired, time.Now(), 1); !wait {
			t.Fatal("the first load did not wait for a read")
		}
		<-s.wake
		if behind, wait := s.behind(ctx, first, fired, time.Now(), 1); behind || wait {
			t.Fatalf("first load: behind = %v, wait = %v, want neither (the watermark is the stream's last fire)", behind, wait)
		}
		publishFire(fired.Add(time.Second))
		again := planEntry(t, "@every 1s", time.Time{})
		s.entries[again.id] = again
		if behind, wait := s.behind(ctx, again, fired, time.Now(), 1); behind || !wait {
			t.Fatalf("the next load: behind = %v, wait = %v, want it to wait for a read of its own", behind, wait)
		}
		<-s.wake
		if behind, wait := s.behind(ctx, again, fired, time.Now(), 1); !behind || wait {
			t.Fatalf("the next load: behind = %v, wait = %v once read, want behind (the stream fired %s after the watermark)", behind, wait, fired.Add(time.Second).Format(time.TimeOnly))
		}
	})

	// A takeover: the first tick after the watermark can still fire within
	// the grace. The load waits for the read only while it can; a start
	// after downtime, whose first tick is past saving, waits for the read.
	t.Run("a load stops waiting before its next tick ages past the grace", func(t *testing.T) {
		s, gate := gatedScheduler(t, NewStreamHistory(js, names))
		defer close(gate.open)
		const left = 300 * time.Millisecond
		taken := planEntry(t, "@every 1s", time.Time{})
		taken.id = "taken"
		started := planEntry(t, "@every 1s", time.Time{})
		started.id = "started"
		s.entries[taken.id], s.entries[started.id] = taken, started
		wm := fired.Add(-time.Second)
		now := taken.sched.Next(wm).Add(s.cfg.Grace - checkFireMargin - left)
		oldWM := now.Add(-10 * time.Minute)
		for _, r := range []*entryRun{taken, started} {
			w := wm
			if r == started {
				w = oldWM
			}
			if behind, wait := s.behind(ctx, r, w, now, 2); behind || !wait {
				t.Fatalf("%s: behind = %v, wait = %v while the read is held, want wait", r.id, behind, wait)
			}
		}
		time.Sleep(left + 100*time.Millisecond)
		if behind, wait := s.behind(ctx, taken, wm, now, 2); behind || wait {
			t.Fatalf("taken over, past its deadline: behind = %v, wait = %v, want neither (unchecked)", behind, wait)
		}
		if behind, wait := s.behind(ctx, started, oldWM, now, 2); behind || !wait {
			t.Fatalf("started after downtime: behind = %v, wait = %v, want it still waiting for the read", behind, wait)
		}
		var m dto.Metric
		if err := s.m.Unchecked.Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
			t.Errorf("cronstream_watermarks_unchecked_total = %v (err %v), want 1", m.GetCounter().GetValue(), err)
		}
	})

	t.Run("a read that fails loads unchecked", func(t *testing.T) {
		s, gate := gatedScheduler(t, NewStreamHistory(js, names))
		defer close(gate.open)
		r := planEntry(t, "@every 1s", time.Time{})
		s.entries[r.id] = r
		wm := fired.Add(-time.Second)
		if behind, wait := s.behind(ctx, r, wm, time.Now(), 1); behind || !wait {
			t.Fatalf("behind = %v, wait = %v while the read is held, want wait", behind, wait)
		}
		// Held past its bound: it fails, and wakes the loop.
		select {
		case <-s.wake:
		case <-time.After(streamReadTimeout + 10*time.Second):
			t.Fatal("the failed read did not wake the loop")
		}
		if behind, wait := s.behind(ctx, r, wm, time.Now(), 1); behind || wait {
			t.Fatalf("behind = %v, wait = %v after the read failed, want neither (unchecked)", behind, wait)
		}
		// The failure pauses the stream reads: the entries that ask next,
		// alone or in a pass, are refused at once and load unchecked in the
		// same turn, waiting for nothing.
		for i := range 20 {
			s.entries[fmt.Sprint("x", i)] = &entryRun{}
		}
		for _, batch := range []int{1, len(s.entries) + 1} {
			next := planEntry(t, "@every 1s", time.Time{})
			next.id = fmt.Sprint("next-", batch)
			s.entries[next.id] = next
			if behind, wait := s.behind(ctx, next, wm, time.Now(), batch); behind || wait {
				t.Fatalf("batch %d, reads paused: behind = %v, wait = %v, want neither (unchecked at once)", batch, behind, wait)
			}
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(s.m.Unchecked)
		families, err := reg.Gather()
		if err != nil || len(families) != 1 || families[0].GetMetric()[0].GetCounter().GetValue() != 3 {
			t.Errorf("cronstream_watermarks_unchecked_total: %v (err %v), want 3", families, err)
		}
	})
}
