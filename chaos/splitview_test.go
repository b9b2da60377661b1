package chaos

import (
	"math/rand/v2"
	"os"
	"time"
)

// splitViews plans a split view per round (doc.go): one replica's view of
// the others frozen for longer than the membership TTL (6 s), while
// another is killed, long enough to leave the other views, and comes back
// inside it, so the views surely disagree; the kill is left out where
// quiet says single kills must not fall. Ownership must keep every tick
// once: a lease has one holder whoever believes what.
func splitViews(rng *rand.Rand, rounds int, span time.Duration, replicas int, quiet func(from, to time.Duration) bool) []episode {
	dur := func(min, spread time.Duration) time.Duration { return min + time.Duration(rng.Int64N(int64(spread)+1)) }
	var plan []episode
	for r := range rounds {
		at := time.Duration(r)*span + time.Duration(float64(span)*(0.1+0.6*rng.Float64()))
		frozen := rng.IntN(replicas)
		plan = append(plan, episode{kind: splitView, target: frozen, at: at, down: dur(12*time.Second, 6*time.Second)})
		killAt, down := at+dur(2*time.Second, 2*time.Second), dur(7*time.Second, 2*time.Second)
		if replicas > 1 && !quiet(killAt, killAt+down) {
			plan = append(plan, episode{kind: killReplica, target: (frozen + 1 + rng.IntN(replicas-1)) % replicas, at: killAt, down: down})
		}
	}
	return plan
}

// freezeView freezes replica i's view of the others (creates its
// --test-freeze-view file), or lets it follow the heartbeats again.
func (s *system) freezeView(i int, frozen bool, tl *timeline) {
	s.t.Helper()
	path := s.replicas[i].freeze
	if !frozen {
		if err := os.Remove(path); err != nil {
			s.t.Fatalf("split view: %v", err)
		}
		tl.logf("replica r%d's view follows the heartbeats again", i)
		return
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		s.t.Fatalf("split view: %v", err)
	}
	tl.count("split view")
	tl.logf("freeze replica r%d's view of the other replicas (split view)", i)
}
