package chaos

import (
	"testing"
	"time"
)

// TestPlanHasEveryFault: every seed's schedule, short or long, holds each
// whole-system fault and a split view once per round, and keeps single
// replica kills and NATS node stops out of the faults they would change.
func TestPlanHasEveryFault(t *testing.T) {
	for _, d := range []time.Duration{shortChaos, 10 * time.Minute} {
		for seed := uint64(1); seed <= 200; seed++ {
			plan := makePlan(seed, d, 3, 3, 2)
			rounds := max(1, int(d/roundEvery))
			count := map[episodeKind]int{}
			for _, e := range plan {
				count[e.kind]++
				big := e.kind == killAllReplicas || e.kind == restartRedis || e.kind == loseRedisData || e.kind == restartNATS
				if e.at < 0 || big && e.at+e.down > d {
					t.Errorf("seed %d, %s: %s falls outside the chaos phase", seed, d, e)
				}
			}
			for _, k := range []episodeKind{killAllReplicas, restartRedis, loseRedisData, restartNATS} {
				if count[k] != rounds {
					t.Errorf("seed %d, %s: %d of kind %d, want one per round (%d)", seed, d, count[k], k, rounds)
				}
			}
			if count[splitView] != rounds {
				t.Errorf("seed %d, %s: %d split views, want one per round (%d)", seed, d, count[splitView], rounds)
			}
			for _, e := range plan {
				if e.kind == splitView && e.at+e.down > d {
					t.Errorf("seed %d, %s: %s outlasts the chaos phase", seed, d, e)
				}
			}
			if count[killReplica] == 0 || count[killWorker] == 0 {
				t.Errorf("seed %d, %s: no single replica or worker kill: %v", seed, d, count)
			}
			for _, big := range plan {
				for _, e := range plan {
					switch {
					case big.kind == loseRedisData && e.kind == killReplica &&
						e.at < big.at+big.down+10*time.Second && e.at+e.down > big.at-15*time.Second:
						t.Errorf("seed %d, %s: %s next to %s", seed, d, e, big)
					case big.kind == restartNATS && e.kind == stopNATSNode &&
						e.at < big.at+big.down+15*time.Second && e.at+e.down > big.at-8*time.Second:
						t.Errorf("seed %d, %s: %s next to %s", seed, d, e, big)
					}
				}
			}
		}
	}
	signs := map[time.Duration]bool{}
	for seed := uint64(1); seed <= 50; seed++ {
		r, off := skewedClock(seed, 3)
		if r < 0 || r > 2 || (off != clockSkew && off != -clockSkew) {
			t.Fatalf("seed %d: replica %d offset %s", seed, r, off)
		}
		signs[off] = true
	}
	if len(signs) != 2 {
		t.Errorf("50 seeds gave clock offsets %v, want both signs", signs)
	}
}
