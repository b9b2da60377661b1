package schedule

import (
	"fmt"
	"testing"
)

func TestPrimaryOf(t *testing.T) {
	live := []string{"r1", "r2", "r3"}
	counts := map[string]int{}
	moved := 0
	for i := 0; i < 3000; i++ {
		e := fmt.Sprintf("entry-%d", i)
		p := primaryOf(e, live)
		counts[p]++
		if primaryOf(e, []string{"r3", "r1", "r2"}) != p {
			t.Fatalf("primary depends on the order of the live list")
		}
		// Only r2's entries move when r2 leaves.
		if q := primaryOf(e, []string{"r1", "r3"}); q != p {
			if p != "r2" {
				t.Fatalf("entry %s moved from %s to %s although %s is still live", e, p, q, p)
			}
			moved++
		}
	}
	for _, r := range live {
		if counts[r] < 800 || counts[r] > 1200 {
			t.Fatalf("uneven spread: %v", counts)
		}
	}
	if moved != counts["r2"] {
		t.Fatalf("moved %d, want %d", moved, counts["r2"])
	}
	if primaryOf("x", nil) != "" {
		t.Fatalf("no live replicas must give no primary")
	}
}
