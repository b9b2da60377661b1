package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestSlowRedisOwnersKeepShards: two replicas 100 ms (a round trip) from
// Redis are given 60 new entries. Loading a shard's entries
// takes a round trip per entry (the restore proposal of a missing
// watermark), which in one turn held the loop past the ownership's
// progress bound: the leases lapsed, the other replica took the shards
// over and stalled the same way, and the shards went back and forth. The
// load goes on over several turns instead: no shard is taken over, and
// every entry fires every second once loaded.
func TestSlowRedisOwnersKeepShards(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("seed", "@every 1s"))
	proxy := testenv.StartProxy(t, e.redis.Addr)
	proxy.SetDelay(50 * time.Millisecond)
	slowNode := func(id string) *node {
		opts := e.redis.Options()
		opts.Addr = proxy.Addr()
		rc := redis.NewClient(opts)
		t.Cleanup(func() { _ = rc.Close() })
		return e.startNode(id, nodeOpts{rc: rc})
	}
	a, b := slowNode("a"), slowNode("b")
	settledOwners(t, []string{"default"}, 30*time.Second, a, b)
	takeovers := func() uint64 { return a.own.Report().Takeovers + b.own.Report().Takeovers }
	before := takeovers() // the subject is the loading; not a slow start
	// Registered live, as sync does: each owner loads its share of them.
	var ids []string
	for i := range 60 {
		id := fmt.Sprintf("slow-%02d", i)
		ids = append(ids, id)
		e.put(every(id, "@every 1s"))
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		ra, rb := a.own.Report(), b.own.Report()
		return ra.Owned == ra.Desired && rb.Owned == rb.Desired && ra.Owned > 0 && rb.Owned > 0
	}, "each replica to hold its share")
	// Loading takes a round trip per entry, and longer on a loaded
	// machine: every entry is checked from when both have loaded theirs.
	testenv.Eventually(t, 30*time.Second, func() bool {
		ca, cb := a.counts(), b.counts()
		return ca.Entries+cb.Entries == len(ids)+1 && ca.Loading == 0 && cb.Loading == 0
	}, "both replicas to load their entries")
	waitUntil(t, time.Now, time.Now().Add(time.Second))
	from := time.Now().Truncate(time.Second)
	waitUntil(t, time.Now, from.Add(6*time.Second))
	a.stop()
	b.stop()
	e.waitOutboxEmpty(10*time.Second, "default")
	if n := takeovers() - before; n != 0 {
		t.Errorf("%d shards taken over from a replica that was loading (its leases lapsed)", n)
	}
	e.checkOnceFrom(ids, from)
}
