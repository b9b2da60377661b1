package scheduler

import (
	"testing"
	"time"
)

// TestPassSize: the passes shrink at once to what fits passTarget after a
// turn slower than passSlow, grow twofold a turn faster than passTarget
// back to Batch × Parallel, never go below minPass, and ignore turns of
// too few entries to time.
func TestPassSize(t *testing.T) {
	const most = 4000
	var p passSize
	T := passTarget
	steps := []struct {
		entries int
		took    time.Duration
		want    int
	}{
		{0, 0, 4000},                   // nothing seen: full passes
		{4000, passSlow, 4000},         // merely overloaded: whole
		{4000, 8 * T, 500},             // slower than passSlow: shrinks at once
		{10, 20 * T, 500},              // too few to time: unchanged
		{500, T, 500},                  // between the two: kept
		{500, T / 5, 1000},             // fast: twofold
		{1000, T / 5, 2000},            // and again
		{2000, T / 2, 4000},            // capped at Batch × Parallel
		{4000, T / 2, 4000},            // stays there
		{100, 40 * T, minPass},         // a saturated Redis: the floor
		{minPass, T / 50, 2 * minPass}, // back up from the floor
		{64, 0, 64},                    // no time measured: unchanged
		{40000, 4 * T, 4000},           // never more than Batch × Parallel
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
