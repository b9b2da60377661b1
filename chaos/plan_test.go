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

// TestChainedKillBands: a replica killed within the takeover bound of
// another's kill opens a band from the first kill to the second; kills
// further apart, and a replica killed again after its restart, open none.
func TestChainedKillBands(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	tl := newTimeline(3)
	tl.replicaDown(0, 1, at(10))
	tl.replicaDown(2, 1, at(13.4)) // took r0's shards, then died
	tl.replicaDown(1, 1, at(30))   // alone
	tl.replicaDown(0, 2, at(33))   // r0 again, 3 s after r1: chained
	tl.replicaDown(0, 3, at(35))   // r0 once more: its own kills chain nothing
	got := tl.chainedKills()
	want := []band{
		{from: at(9), to: at(14.4), why: whyChainedKill},
		{from: at(29), to: at(34), why: whyChainedKill},
		{from: at(29), to: at(36), why: whyChainedKill},
	}
	if len(got) != len(want) {
		t.Fatalf("bands %v, want %v", got, want)
	}
	for i := range want {
		if !got[i].from.Equal(want[i].from) || !got[i].to.Equal(want[i].to) {
			t.Errorf("band %d: %v, want %v", i, got[i], want[i])
		}
	}
}
