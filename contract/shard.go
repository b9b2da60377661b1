package contract

import (
	"cmp"
	"hash/fnv"
	"slices"
	"strconv"
)

// ShardsPerQueue is how many shards the entries of one queue are divided
// into for ownership (docs/design.md "Ownership"): each shard has one
// owning replica at a time, held by a lease in the queue's Redis slot. It
// is part of the contract between replicas of one deployment, like the id
// formats: replicas that divided entries differently would each own a
// different set, so it is a constant, never a flag.
const ShardsPerQueue = 64

// Shard is one shard of a queue: the entries of Queue whose ShardOf is
// Index.
type Shard struct {
	Queue string
	Index int
}

// String is "<queue>/<index>", for logs and status.
func (s Shard) String() string { return s.Queue + "/" + strconv.Itoa(s.Index) }

// Compare orders shards by queue, then index.
func (s Shard) Compare(o Shard) int {
	return cmp.Or(cmp.Compare(s.Queue, o.Queue), cmp.Compare(s.Index, o.Index))
}

// ShardOf is the shard index of entry within its queue: a hash of the id,
// so an entry keeps its index when it moves to another queue and every
// replica computes the same one.
func ShardOf(entry string) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(entry))
	return int(Mix64(h.Sum64()) % ShardsPerQueue)
}

// ShardOfEntry is the shard entry id belongs to in queue.
func ShardOfEntry(queue, entry string) Shard { return Shard{Queue: queue, Index: ShardOf(entry)} }

// QueueShards are the ShardsPerQueue shards of queue, in index order.
func QueueShards(queue string) []Shard {
	out := make([]Shard, ShardsPerQueue)
	for i := range out {
		out[i] = Shard{Queue: queue, Index: i}
	}
	return out
}

// Mix64 is the splitmix64 finaliser: FNV's low bits mix poorly for
// similar inputs, and shard indexes and rendezvous scores are taken from
// them.
func Mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// DutyShard is the shard whose owner holds queue's duties when the shard
// set's queues are queues (sorted): its shard 0 when it has shards, else a
// shard of the first queue picked by a hash of its name. ok is false when
// there is no shard set (no entries at all).
func DutyShard(queues []string, queue string) (Shard, bool) {
	if len(queues) == 0 {
		return Shard{}, false
	}
	if _, found := slices.BinarySearch(queues, queue); found {
		return Shard{Queue: queue, Index: 0}, true
	}
	// The entry-id hash serves a queue name as well: any fixed spread.
	return Shard{Queue: queues[0], Index: ShardOf(queue)}, true
}

// GlobalShard is the shard whose owner holds the global duty: shard 0 of
// the first queue of the shard set.
func GlobalShard(queues []string) (Shard, bool) {
	if len(queues) == 0 {
		return Shard{}, false
	}
	return Shard{Queue: queues[0], Index: 0}, true
}
