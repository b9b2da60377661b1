package scheduler

import (
	"github.com/cronstream/cronstream/schedule"
)

// Shards tells the scheduler which shards it fires (docs/design.md
// "Ownership"): a replica holds runs, timers and watermarks only for the
// entries of the shards whose lease it holds, and fires them only while
// the lease is valid by its own clock. Ownership decides who tries, never
// whether a tick fires once: the watermark's compare-and-set and the
// fences do, so two replicas that both believe they own a shard get
// refusals, never a duplicate.
type Shards interface {
	// Owned returns the shards this replica holds now.
	Owned() OwnedShards
	// Changed returns a channel that is signalled (never closed) after
	// Owned's set of shards changed.
	Changed() <-chan struct{}
	// Turned is told after each turn of the firing loop, with the version
	// of the set the loop holds runs for: the loop's progress (a lease is
	// renewed only while the loop turns, so a hung owner loses its
	// shards) and when a shard taken out of the set has no fire in flight
	// any more (its lease is released only then).
	Turned(version uint64)
}

// OwnedShards is a set of owned shards (schedule.OwnedShards).
type OwnedShards = schedule.OwnedShards

// ownsAll is the Shards of a scheduler without ownership (Config.Shards
// nil): a lone replica, or a program that embeds one, fires every entry.
func (s *Scheduler) ownsAll() bool { return s.cfg.Shards == nil }
