package taskstate

import (
	"slices"
	"testing"
	"time"
)

// TestFireSkip records missed ticks without creating a task, under the same
// compare-and-set as a tick, and keeps the last fired task for overlap.
func TestFireSkip(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	mustFire(t, s, tickFire("skip", "default", tickAt(0), time.Time{}), StatusFired)
	skip := Fire{
		Prefix: testPrefix, Entry: "skip", Queue: "default", Kind: FireSkip,
		Tick: tickAt(4), Expected: tickAt(0),
		SkippedRecords: []Record{record("skipped", "skip", tickAt(1))},
	}
	stale := skip
	stale.Expected = tickAt(-1)
	mustFire(t, s, stale, StatusWatermarkMismatch)
	mustFire(t, s, skip, StatusSkippedMissed)
	assertWatermark(t, s, "default", "skip", tickAt(4), taskIDFor("skip", tickAt(0)))
	want := []string{record("fired", "skip", tickAt(0)).ID, record("skipped", "skip", tickAt(1)).ID}
	if got := outboxIDs(t, s, "default"); !slices.Equal(got, want) {
		t.Fatalf("outbox = %v, want %v", got, want)
	}
	// No task was created for the skip, and the pending list is untouched.
	if n := rc.LLen(t.Context(), Keys("default").Pending()).Val(); n != 1 {
		t.Fatalf("pending has %d tasks, want only the fired one", n)
	}
	// A racing replica's skip of the same gap is refused and appends nothing.
	mustFire(t, s, skip, StatusWatermarkMismatch)
	if got := outboxIDs(t, s, "default"); len(got) != 2 {
		t.Fatalf("refused skip appended records: %v", got)
	}
	// The next tick fires against the skip's watermark.
	mustFire(t, s, tickFire("skip", "default", tickAt(5), tickAt(4)), StatusFired)

	// A skip with nothing to record is refused before it reaches Redis.
	empty := skip
	empty.SkippedRecords = nil
	if _, err := s.FireOnce(t.Context(), testFences, empty); err == nil {
		t.Fatal("a skip without records was accepted")
	}
}
