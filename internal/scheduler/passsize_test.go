package scheduler

import (
	"testing"
	"time"
)

// TestPassSize: the passes shrink at once to what fits passTarget, grow
// at most twofold a turn back to Batch × Parallel, never below minPass,
// and ignore turns of too few entries to time.
func TestPassSize(t *testing.T) {
	const most = 4000
	var p passSize
	T := passTarget
	steps := []struct {
		entries int
		took    time.Duration
		want    int
	}{
		{0, 0, 4000},            // nothing seen: full passes
		{4000, 8 * T, 500},      // 8 times too slow: shrinks at once
		{10, 20 * T, 500},       // too few to time: unchanged
		{500, T / 5, 1000},      // fast again: twofold
		{1000, T / 5, 2000},     // and again
		{2000, 2 * T / 5, 4000}, // capped at Batch × Parallel
		{4000, 2 * T / 5, 4000}, // stays there
		{100, 40 * T, minPass},  // a saturated Redis: the floor
		{minPass, T / 50, 64},   // back up from the floor
		{64, T, 64},             // at the target: kept
		{64, 0, 64},             // no time measured: unchanged
		{5000, T, 128},          // twofold at most, whatever fits
	}
	for i, st := range steps {
		p.observe(st.entries, st.took, most)
		if got := p.get(most); got != st.want {
			t.Fatalf("step %d (%d entries in %s): pass size %d, want %d", i, st.entries, st.took, got, st.want)
		}
	}
	// A smaller Batch × Parallel caps the passes at once, and the floor
	// never exceeds it.
	if got := p.get(100); got != 100 {
		t.Errorf("pass size %d with at most 100, want 100", got)
	}
	p.observe(1000, 10*time.Second, 10)
	if got := p.get(10); got != 10 {
		t.Errorf("pass size %d with at most 10 after a slow turn, want 10", got)
	}
}
