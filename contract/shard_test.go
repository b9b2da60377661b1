package contract

import (
	"fmt"
	"testing"
)

// pinnedShards are ShardOf("a"), ShardOf("daily-report") and ShardOf("e00").
const pinnedShards = "56 33 57"

// TestShardOf pins the shard function's values (replicas of one deployment
// must agree on them, across versions) and checks its spread.
func TestShardOf(t *testing.T) {
	if got := fmt.Sprint(ShardOf("a"), ShardOf("daily-report"), ShardOf("e00")); got != pinnedShards {
		t.Errorf("shard values changed: %s, pinned %s (a change here moves every entry to another shard)", got, pinnedShards)
	}
	counts := make([]int, ShardsPerQueue)
	const n = 64_000
	for i := range n {
		counts[ShardOf(fmt.Sprintf("entry-%d", i))]++
	}
	for k, c := range counts {
		if c < n/ShardsPerQueue*8/10 || c > n/ShardsPerQueue*12/10 {
			t.Errorf("shard %d holds %d of %d entries: uneven spread %v", k, c, n, counts)
			break
		}
	}
	if s := ShardOfEntry("q", "a"); s.Queue != "q" || s.Index != ShardOf("a") || s.String() != fmt.Sprintf("q/%d", ShardOf("a")) {
		t.Errorf("ShardOfEntry = %+v (%s)", s, s)
	}
	if qs := QueueShards("q"); len(qs) != ShardsPerQueue || qs[5] != (Shard{"q", 5}) {
		t.Errorf("QueueShards = %v", qs)
	}
}
