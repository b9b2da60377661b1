package ownership

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cronstream/cronstream/events"
)

func shardsOf(queues ...string) []events.Shard {
	var out []events.Shard
	for _, q := range queues {
		out = append(out, events.QueueShards(q)...)
	}
	return out
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("replica-%02d", i)
	}
	return out
}

// TestAssignBalanced: every shard has one desired owner, loads differ by
// at most one shard (spread max/mean within the design's 1.3 wherever a
// replica's share is a few shards), every candidate computes the same
// owners, and each shard's other candidates hold the ranks 1..n-1 once
// each, so exactly one replica may take a free shard at each step; the
// queues' shards 0 (their duties) are spread within one of each other too.
func TestAssignBalanced(t *testing.T) {
	for _, c := range []struct {
		queues   int
		replicas int
	}{{1, 1}, {1, 3}, {1, 10}, {8, 3}, {8, 4}, {3, 10}, {20, 7}} {
		t.Run(fmt.Sprintf("%dq-%dr", c.queues, c.replicas), func(t *testing.T) {
			var qs []string
			for i := range c.queues {
				qs = append(qs, fmt.Sprintf("q%d", i))
			}
			shards := shardsOf(qs...)
			cands := names(c.replicas)
			views := map[string]assignment{}
			for _, self := range cands {
				views[self] = assign(cands, shards, self)
			}
			load, duties := map[string]int{}, map[string]int{}
			for _, s := range shards {
				owner := views[cands[0]].desired[s]
				load[owner]++
				if s.Index == 0 {
					duties[owner]++
				}
				ranks := map[int]bool{}
				for _, self := range cands {
					a := views[self]
					if a.desired[s] != owner {
						t.Fatalf("shard %s: %s computes owner %s, %s computes %s", s, self, a.desired[s], cands[0], owner)
					}
					r, ok := a.rank[s]
					if !ok || ranks[r] || (r == 0) != (self == owner) {
						t.Fatalf("shard %s: %s has rank %d (%v), owner %s, ranks so far %v", s, self, r, ok, owner, ranks)
					}
					ranks[r] = true
				}
			}
			lo, hi := len(shards), 0
			for _, self := range cands {
				lo, hi = min(lo, load[self]), max(hi, load[self])
				if views[self].mine != load[self] {
					t.Errorf("%s counts %d shards of its own, owns %d", self, views[self].mine, load[self])
				}
			}
			if hi-lo > 1 {
				t.Errorf("loads from %d to %d: %v", lo, hi, load)
			}
			// Queue duties (shard 0 of each queue) are spread as evenly.
			lo, hi = c.queues, 0
			for _, self := range cands {
				lo, hi = min(lo, duties[self]), max(hi, duties[self])
			}
			if hi-lo > 1 {
				t.Errorf("queue duties from %d to %d: %v", lo, hi, duties)
			}
		})
	}
}

// TestAssignMoves: a replica leaving moves its own shards and few others;
// one that is no candidate gets no rank.
func TestAssignMoves(t *testing.T) {
	shards := shardsOf("a", "b", "c", "d", "e", "f", "g", "h")
	cands := names(4)
	before := assign(cands, shards, "x")
	if len(before.rank) != 0 || before.mine != 0 {
		t.Errorf("a replica that is no candidate has ranks %d, owns %d", len(before.rank), before.mine)
	}
	after := assign(cands[1:], shards, "x")
	moved, theirs := 0, 0
	for _, s := range shards {
		if before.desired[s] == cands[0] {
			theirs++
			continue
		}
		if before.desired[s] != after.desired[s] {
			moved++
		}
	}
	// Bounded loads move more than the leaver's own shards, but few.
	if moved > theirs/2 {
		t.Errorf("%d shards of staying replicas moved when one with %d left", moved, theirs)
	}
	t.Logf("replica with %d of %d shards left; %d others moved", theirs, len(shards), moved)
	if a := assign(nil, shards, "x"); a.desired[shards[0]] != "" || len(a.rank) != 0 {
		t.Errorf("no candidates: %+v", a.desired[shards[0]])
	}
}

// TestLiveRank: a replica's rank for a free shard counts only the
// candidates ahead of it that hold a lease, so when the desired owner and
// the candidates ranked before it all died, it takes the shard one step
// after it lapsed, as rank 1 would; a candidate ahead that holds a lease
// (alive) keeps its turn first.
func TestLiveRank(t *testing.T) {
	shards := shardsOf("a", "b", "c", "d")
	cands := names(5)
	checked := 0
	for _, self := range cands {
		a := assign(cands, shards, self)
		for _, s := range shards {
			r := a.rank[s]
			if r < 2 {
				if got := a.liveRank(s, nil); got != r {
					t.Fatalf("%s, shard %s: live rank %d with nobody holding, want its rank %d", self, s, got, r)
				}
				continue
			}
			checked++
			ahead := a.ahead[s]
			if len(ahead) != r-1 || slices.Contains(ahead, self) || slices.Contains(ahead, a.desired[s]) {
				t.Fatalf("%s, shard %s: rank %d, ahead %v (owner %s)", self, s, r, ahead, a.desired[s])
			}
			if got := a.liveRank(s, map[string]bool{a.desired[s]: true}); got != 1 {
				t.Errorf("%s, shard %s: rank %d behind dead candidates: live rank %d, want 1", self, s, r, got)
			}
			all := map[string]bool{}
			for _, c := range cands {
				all[c] = true
			}
			if got := a.liveRank(s, all); got != r {
				t.Errorf("%s, shard %s: every candidate holding: live rank %d, want %d", self, s, got, r)
			}
			if got := a.liveRank(s, map[string]bool{ahead[0]: true}); got != 2 {
				t.Errorf("%s, shard %s: one candidate ahead holding: live rank %d, want 2", self, s, got)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no shard with a rank of 2 or more")
	}
}
