package ownership

import (
	"cmp"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/cronstream/cronstream/events"
)

// assignment is who should own each shard, given the candidates and the
// shards: consistent hashing with bounded loads. Every replica with the
// same view computes the same one.
type assignment struct {
	// desired is each shard's desired owner ("" when there is no
	// candidate).
	desired map[events.Shard]string
	// rank is this replica's rank for each shard: 0 for the shards it is
	// the desired owner of, else its place (1, 2, ...) among the other
	// candidates in the shard's rendezvous order; absent when it is no
	// candidate.
	rank map[events.Shard]int
	// ahead is, for each shard this replica has a rank above 0 for, the
	// candidates between the desired owner and it in the shard's
	// rendezvous order (liveRank counts those that show life).
	ahead map[events.Shard][]string
	// mine counts the shards this replica is the desired owner of.
	mine int
}

// assign computes the assignment of shards over candidates (sorted ids),
// with self's ranks. Shards are visited in a fixed order (by a hash of the
// shard, so that no queue is always served first), each given to the
// candidate with the highest rendezvous score whose load leaves room for
// everyone's: loads differ by at most one shard, where plain rendezvous
// hashing leaves a spread of about twice the mean with few shards per
// replica. Shards 0, whose owners hold their queues' duties, are visited
// first and spread the same way among themselves. A candidate joining or
// leaving moves about its share of shards, a little more than plain
// rendezvous as the caps move.
func assign(candidates []string, shards []events.Shard, self string) assignment {
	a := assignment{desired: make(map[events.Shard]string, len(shards)), rank: map[events.Shard]int{}, ahead: map[events.Shard][]string{}}
	if len(candidates) == 0 {
		for _, s := range shards {
			a.desired[s] = ""
		}
		return a
	}
	order := slices.Clone(shards)
	keys := make(map[events.Shard]uint64, len(order))
	for _, s := range order {
		keys[s] = shardHash(s)
	}
	// Shards 0 first: their owners hold their queues' duties (duties.go),
	// which are spread as evenly as the shards.
	slices.SortFunc(order, func(x, y events.Shard) int {
		return cmp.Or(cmp.Compare(min(x.Index, 1), min(y.Index, 1)), cmp.Compare(keys[x], keys[y]), x.Compare(y))
	})
	queues := 0
	for _, s := range order {
		if s.Index == 0 {
			queues++
		}
	}
	floor0, extra0 := queues/len(candidates), queues%len(candidates)
	atCeil0 := 0
	load0 := make(map[string]int, len(candidates))
	fits0 := func(n int) bool { return n < floor0 || (n == floor0 && atCeil0 < extra0) }
	// Each candidate gets floor or floor+1 shards, extra of them floor+1.
	// A cap of ceil(shards / candidates) alone bounds the largest load,
	// not the smallest: the last candidates to fill can end several
	// shards short (64 shards over 10 replicas: 7 each for eight, 4 for
	// two).
	floor, extra := len(shards)/len(candidates), len(shards)%len(candidates)
	atCeil := 0
	fits := func(n int) bool { return n < floor || (n == floor && atCeil < extra) }
	load := make(map[string]int, len(candidates))
	selfCandidate := slices.Contains(candidates, self)
	scores := make([]uint64, len(candidates))
	for _, s := range order {
		best := -1
		for i, c := range candidates {
			scores[i] = score(keys[s], c)
			if fits(load[c]) && (s.Index != 0 || fits0(load0[c])) && (best < 0 || scores[i] > scores[best] || (scores[i] == scores[best] && c < candidates[best])) {
				best = i
			}
		}
		owner := candidates[best]
		a.desired[s] = owner
		if load[owner]++; load[owner] > floor {
			atCeil++
		}
		if s.Index == 0 {
			if load0[owner]++; load0[owner] > floor0 {
				atCeil0++
			}
		}
		if !selfCandidate {
			continue
		}
		if owner == self {
			a.rank[s] = 0
			a.mine++
			continue
		}
		// self's place among the others, in the shard's rendezvous order.
		mine := score(keys[s], self)
		var ahead []string
		for i, c := range candidates {
			if c != self && c != owner && (scores[i] > mine || (scores[i] == mine && c < self)) {
				ahead = append(ahead, c)
			}
		}
		a.rank[s] = 1 + len(ahead)
		if len(ahead) > 0 {
			a.ahead[s] = ahead
		}
	}
	return a
}

// liveRank is this replica's rank for free shard s counting only the
// candidates ahead of it that hold a lease (holding): one that holds none
// is dead, or has just joined and takes its own shards at once. So the
// shards of several owners killed together are taken one step after their
// leases lapse, as one owner's are, instead of waiting a step for each
// dead candidate ranked before the survivor.
func (a assignment) liveRank(s events.Shard, holding map[string]bool) int {
	r, ok := a.rank[s]
	if !ok || r == 0 {
		return r
	}
	r = 1
	for _, c := range a.ahead[s] {
		if holding[c] {
			r++
		}
	}
	return r
}

// shardHash is the hash a shard's rendezvous scores start from.
func shardHash(s events.Shard) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.Queue))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(strconv.Itoa(s.Index)))
	return events.Mix64(h.Sum64())
}

// score is candidate c's rendezvous score for the shard whose hash is key.
func score(key uint64, c string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(key >> (8 * i))
	}
	_, _ = h.Write(b[:])
	_, _ = h.Write([]byte(c))
	return events.Mix64(h.Sum64())
}
