package taskstate

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestRestoreProposal: a proposal only rises, keeps the settle instant of
// its creation (Redis TIME), settles, is listed per queue, and is cleared
// only while it still proposes the tick seeded.
func TestRestoreProposal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	propose := func(n int, want int) RestoreProposal {
		t.Helper()
		var tick time.Time
		if n >= 0 {
			tick = tickAt(n)
		}
		p, err := s.ProposeRestore(ctx, testPrefix, "default", "w", tick, taskIDFor("w", tick), 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if want < 0 {
			if p.Found {
				t.Fatalf("proposal %+v, want none", p)
			}
			return p
		}
		if !p.Found || !p.Tick.Equal(tickAt(want)) || p.TaskID != taskIDFor("w", tickAt(want)) {
			t.Fatalf("proposal %+v, want tick %s", p, tickAt(want))
		}
		return p
	}
	propose(-1, -1) // reading creates nothing
	if p := propose(3, 3); p.Settled || p.Left <= 0 || p.Left > 500*time.Millisecond {
		t.Fatalf("a new proposal %+v, want settling within 500ms", p)
	}
	propose(1, 3) // never lowered
	propose(5, 5) // raised
	propose(-1, 5)
	if _, err := s.ProposeRestore(ctx, testPrefix, "other", "w", tickAt(2), "x", time.Hour); err != nil {
		t.Fatal(err)
	}
	all, err := s.RestoreProposals(ctx, testPrefix, []string{"default", "other", "empty"})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || !all["default"]["w"].Equal(tickAt(5)) || !all["other"]["w"].Equal(tickAt(2)) {
		t.Fatalf("proposals %v", all)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		p, err := s.ProposeRestore(ctx, testPrefix, "default", "w", time.Time{}, "", time.Hour)
		return err == nil && p.Settled && p.Tick.Equal(tickAt(5))
	}, "the proposal to settle at the delay of its creation")
	if err := s.ClearRestore(ctx, testPrefix, "default", "w", tickAt(3)); err != nil {
		t.Fatal(err)
	}
	propose(-1, 5) // another tick than the one proposed: kept
	if err := s.ClearRestore(ctx, testPrefix, "default", "w", tickAt(5)); err != nil {
		t.Fatal(err)
	}
	propose(-1, -1)

	// A watermark at or past the tick proposed: restored already.
	if err := s.SeedWatermark(ctx, testPrefix, "default", "w", tickAt(5), taskIDFor("w", tickAt(5)), 1, ""); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{-1, 4, 5} {
		var tick time.Time
		if n >= 0 {
			tick = tickAt(n)
		}
		p, err := s.ProposeRestore(ctx, testPrefix, "default", "w", tick, "x", time.Second)
		if err != nil || !p.Restored || p.Found {
			t.Fatalf("proposing %v over a watermark at %s: %+v, %v; want restored already", tick, tickAt(5), p, err)
		}
	}
	propose(6, 6) // past the watermark: proposed

	// A leftover proposal at or below the watermark (its restore seeded
	// the watermark, the clear was lost) is dropped, not taken as settled
	// by a later restore.
	if err := s.SeedWatermark(ctx, testPrefix, "default", "w", tickAt(6), taskIDFor("w", tickAt(6)), 1, ""); err != nil {
		t.Fatal(err)
	}
	if p, err := s.ProposeRestore(ctx, testPrefix, "default", "w", time.Time{}, "", time.Second); err != nil || !p.Restored {
		t.Fatalf("reading a leftover proposal: %+v, %v; want restored already", p, err)
	}
	if all, err := s.RestoreProposals(ctx, testPrefix, []string{"default"}); err != nil || len(all["default"]) != 0 {
		t.Fatalf("proposals after the leftover was read: %v, %v", all, err)
	}
}

// TestOpenRestore: a proposal opened without a position (a replica that
// holds none and cannot read the stream) settles with a zero tick when no
// replica raises it, is raised by any position, is listed with a zero tick
// meanwhile, is cleared as zero, and reports restored over a watermark.
func TestOpenRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	p, err := s.OpenRestore(ctx, testPrefix, "default", "lone", 300*time.Millisecond)
	if err != nil || !p.Found || !p.Tick.IsZero() || p.TaskID != "" || p.Settled {
		t.Fatalf("opened: %+v, %v; want found, settling, no tick", p, err)
	}
	if all, err := s.RestoreProposals(ctx, testPrefix, []string{"default"}); err != nil || len(all["default"]) != 1 || !all["default"]["lone"].IsZero() {
		t.Fatalf("proposals listed: %v, %v; want lone with a zero tick", all, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		p, err := s.OpenRestore(ctx, testPrefix, "default", "lone", time.Hour)
		return err == nil && p.Settled && p.Tick.IsZero()
	}, "the unraised proposal to settle with no tick (opening again keeps its settle instant)")
	if err := s.ClearRestore(ctx, testPrefix, "default", "lone", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.ProposeRestore(ctx, testPrefix, "default", "lone", time.Time{}, "", time.Hour); err != nil || p.Found {
		t.Fatalf("after the clear: %+v, %v; want none", p, err)
	}

	// Raised by a replica's position: the position seeds it.
	if _, err := s.OpenRestore(ctx, testPrefix, "default", "w", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ProposeRestore(ctx, testPrefix, "default", "w", tickAt(4), taskIDFor("w", tickAt(4)), time.Hour); err != nil {
		t.Fatal(err)
	}
	p, err = s.OpenRestore(ctx, testPrefix, "default", "w", time.Hour)
	if err != nil || !p.Tick.Equal(tickAt(4)) || p.TaskID != taskIDFor("w", tickAt(4)) {
		t.Fatalf("opened again after a raise: %+v, %v; want tick %s kept", p, err, tickAt(4))
	}

	// Over a watermark: restored already, nothing opened.
	if err := s.SeedWatermark(ctx, testPrefix, "default", "seeded", tickAt(2), taskIDFor("seeded", tickAt(2)), 1, ""); err != nil {
		t.Fatal(err)
	}
	if p, err := s.OpenRestore(ctx, testPrefix, "default", "seeded", time.Hour); err != nil || !p.Restored || p.Found {
		t.Fatalf("opening over a watermark: %+v, %v; want restored already", p, err)
	}
}

// TestRestoreWatermarkRecordsLoss: the restore appends the lost record in
// the step that raises the watermark from the value the loss was found
// at; a second restore of the same loss (another replica) finds the
// watermark raised and records nothing, and so does one that found
// another value; a loss found with no watermark is recorded while there
// is none.
func TestRestoreWatermarkRecordsLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustFire(t, s, tickFire("w", "default", tickAt(1), time.Time{}), StatusFired)
	before := len(outboxIDs(t, s, "default"))
	lost := &LostRecord{Record: record("lost", "w", tickAt(4)), Found: tickAt(1)}
	restore := func(found time.Time, none bool, to int) bool {
		t.Helper()
		l := *lost
		l.Found, l.FoundNone = found, none
		ok, err := s.RestoreWatermark(ctx, testPrefix, "default", "w", tickAt(to), taskIDFor("w", tickAt(to)), 10, "", &l)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !restore(tickAt(1), false, 4) {
		t.Fatal("the first restore of the loss did not record it")
	}
	assertWatermark(t, s, "default", "w", tickAt(4), taskIDFor("w", tickAt(4)))
	if restore(tickAt(1), false, 4) {
		t.Fatal("a second restore of the same loss recorded it again")
	}
	if restore(tickAt(2), false, 5) {
		t.Fatal("a restore computed against another watermark recorded its loss")
	}
	assertWatermark(t, s, "default", "w", tickAt(5), taskIDFor("w", tickAt(5)))
	if ids := outboxIDs(t, s, "default"); len(ids) != before+1 || ids[len(ids)-1] != lost.ID {
		t.Fatalf("outbox %v; want the lost record once after %d records", ids, before)
	}

	if restore(time.Time{}, true, 6) {
		t.Fatal("a loss found with no watermark recorded while one exists")
	}
	if !restoreOn(t, s, "fresh", lost) {
		t.Fatal("a loss found with no watermark, restored while there is none, was not recorded")
	}
}

// restoreOn restores entry's missing watermark in a queue where it has
// none, recording lost as found with none.
func restoreOn(t *testing.T, s *Store, queue string, lost *LostRecord) bool {
	t.Helper()
	l := *lost
	l.FoundNone = true
	ok, err := s.RestoreWatermark(context.Background(), testPrefix, queue, "w", tickAt(9), taskIDFor("w", tickAt(9)), 10, "", &l)
	if err != nil {
		t.Fatal(err)
	}
	if qs, _ := s.OutboxQueues(context.Background(), testPrefix); !slices.Contains(qs, queue) {
		t.Fatalf("queue %q not registered as having an outbox: %v", queue, qs)
	}
	return ok
}
