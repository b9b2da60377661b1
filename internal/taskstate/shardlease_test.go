package taskstate

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestShardLeases: acquire takes free leases and renews the caller's own,
// refuses others'; renew keeps the acquired time and fails on a lease
// another replica took; release deletes only the caller's; one read returns
// every held lease of several queues with Redis TIME, holder and ages.
func TestShardLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	checkShardLeases(t, ctx, s, []string{"default", "other"})
}

// TestShardLeasesCluster is TestShardLeases on a three-master Redis Cluster
// with queue names that need the hash tag: a queue's leases share its slot,
// so each script call and each MGET is one slot.
func TestShardLeasesCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(testenv.StartRedisCluster(t).Client(t))
	checkShardLeases(t, ctx, s, []string{"critical", "a:b", "x{y", "default"})
}

func checkShardLeases(t *testing.T, ctx context.Context, s *Store, queues []string) {
	t.Helper()
	const ttl = 3 * time.Second
	var mine, theirs []contract.Shard
	for _, q := range queues {
		mine = append(mine, contract.Shard{Queue: q, Index: 0}, contract.Shard{Queue: q, Index: 63})
		theirs = append(theirs, contract.Shard{Queue: q, Index: 5})
	}
	expectHeld := func(what string, res []LeaseResult, err error, want bool) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for i, r := range res {
			if r.Err != nil || r.Held != want {
				t.Fatalf("%s: result %d = %+v, want held %v", what, i, r, want)
			}
		}
	}
	res, err := s.AcquireShardLeases(ctx, testPrefix, "r 1", ttl, mine)
	expectHeld("acquire free", res, err, true)
	res, err = s.AcquireShardLeases(ctx, testPrefix, "r2", ttl, theirs)
	expectHeld("acquire free by r2", res, err, true)
	res, err = s.AcquireShardLeases(ctx, testPrefix, "r2", ttl, mine)
	expectHeld("acquire held by r 1", res, err, false)
	res, err = s.RenewShardLeases(ctx, testPrefix, "r 1", ttl, theirs)
	expectHeld("renew r2's", res, err, false)

	v, err := s.ShardLeases(ctx, testPrefix, queues, false)
	if err != nil || len(v.Unreadable) > 0 {
		t.Fatalf("read: %v %v", err, v.Unreadable)
	}
	if len(v.Leases) != len(mine)+len(theirs) {
		t.Fatalf("read %d leases, want %d: %+v", len(v.Leases), len(mine)+len(theirs), v.Leases)
	}
	first := map[contract.Shard]ShardLease{}
	for _, l := range v.Leases {
		want := "r 1"
		if l.Shard.Index == 5 {
			want = "r2"
		}
		if l.Holder != want || l.TTL != ttl || l.Renewed.Before(l.Acquired) || l.Expires().Sub(v.Now) > ttl || l.Expires().Before(v.Now) {
			t.Errorf("lease %s = %+v at %s, want held by %q", l.Shard, l, v.Now, want)
		}
		first[l.Shard] = l
	}

	// Renewing keeps the acquired time and moves the renewal.
	testenv.Eventually(t, 5*time.Second, func() bool {
		now, err := s.client.Time(ctx).Result()
		return err == nil && now.Sub(first[mine[0]].Renewed) >= 20*time.Millisecond
	}, "Redis TIME to move on")
	res, err = s.RenewShardLeases(ctx, testPrefix, "r 1", ttl, mine)
	expectHeld("renew own", res, err, true)
	res, err = s.AcquireShardLeases(ctx, testPrefix, "r 1", ttl, mine)
	expectHeld("acquire own (renews)", res, err, true)
	v, err = s.ShardLeases(ctx, testPrefix, queues, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range v.Leases {
		f := first[l.Shard]
		if !l.Acquired.Equal(f.Acquired) || (l.Holder == "r 1" && !l.Renewed.After(f.Renewed)) {
			t.Errorf("lease %s after renewal %+v, before %+v", l.Shard, l, f)
		}
	}

	res, err = s.ReleaseShardLeases(ctx, testPrefix, "r2", mine)
	expectHeld("release r 1's by r2", res, err, false)
	res, err = s.ReleaseShardLeases(ctx, testPrefix, "r 1", mine)
	expectHeld("release own", res, err, true)
	v, err = s.ShardLeases(ctx, testPrefix, queues, false)
	if err != nil || len(v.Leases) != len(theirs) {
		t.Fatalf("after release: %+v, %v", v.Leases, err)
	}
	// A renewal of a free lease takes it again (lapsed, or lost with
	// Redis's data).
	res, err = s.RenewShardLeases(ctx, testPrefix, "r 1", ttl, mine)
	expectHeld("renew a free lease", res, err, true)
}

// TestShardLeaseExpires: a lease not renewed lapses after its ttl and is
// free for another replica; the earlier holder's renewal then fails.
func TestShardLeaseExpires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	sh := []contract.Shard{{Queue: "default", Index: 7}}
	if res, err := s.AcquireShardLeases(ctx, testPrefix, "a", 200*time.Millisecond, sh); err != nil || !res[0].Held {
		t.Fatalf("acquire: %+v %v", res, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		res, err := s.AcquireShardLeases(ctx, testPrefix, "b", time.Second, sh)
		return err == nil && res[0].Held
	}, "the lapsed lease to be free")
	if res, err := s.RenewShardLeases(ctx, testPrefix, "a", time.Second, sh); err != nil || res[0].Held {
		t.Fatalf("renewal of a lease taken since: %+v %v", res, err)
	}
}

// TestShardLeaseConcurrentAcquirers: eight replicas race for the same 64
// leases of two queues, many rounds; each lease has exactly one holder, and
// the holder each acquirer was told is the one stored.
func TestShardLeaseConcurrentAcquirers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	var shards []contract.Shard
	for _, q := range []string{"q1", "q2"} {
		shards = append(shards, contract.QueueShards(q)[:32]...)
	}
	for round := range 5 {
		var mu sync.Mutex
		won := map[contract.Shard][]string{}
		var wg sync.WaitGroup
		for r := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := fmt.Sprintf("r%d", r)
				res, err := s.AcquireShardLeases(ctx, testPrefix, owner, time.Minute, shards)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for i, x := range res {
					if x.Held {
						won[shards[i]] = append(won[shards[i]], owner)
					}
				}
			}()
		}
		wg.Wait()
		v, err := s.ShardLeases(ctx, testPrefix, []string{"q1", "q2"}, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Leases) != len(shards) {
			t.Fatalf("round %d: %d leases held, want %d", round, len(v.Leases), len(shards))
		}
		for _, l := range v.Leases {
			if w := won[l.Shard]; len(w) != 1 || w[0] != l.Holder {
				t.Errorf("round %d: shard %s stored for %s, acquired by %v", round, l.Shard, l.Holder, w)
			}
		}
		// Each holder releases; the next round races again.
		for _, l := range v.Leases {
			if _, err := s.ReleaseShardLeases(ctx, testPrefix, l.Holder, []contract.Shard{l.Shard}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestNATSHeard: each replica's last NATS contact is kept and read back;
// one not heard of for a day is forgotten.
func TestNATSHeard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	now := time.UnixMilli(time.Now().UnixMilli())
	for id, at := range map[string]time.Time{"old": now.Add(-25 * time.Hour), "a": now.Add(-time.Second), "b": now} {
		if err := s.NoteNATSHeard(ctx, testPrefix, id, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.NoteNATSHeard(ctx, testPrefix, "b", now); err != nil { // prunes "old"
		t.Fatal(err)
	}
	v, err := s.ShardLeases(ctx, testPrefix, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Heard) != 2 || !v.Heard["a"].Equal(now.Add(-time.Second)) || !v.Heard["b"].Equal(now) {
		t.Errorf("heard = %v", v.Heard)
	}
}

// TestParseShardLease reads lease values, replica ids with spaces
// included, and refuses what is not one.
func TestParseShardLease(t *testing.T) {
	t.Parallel()
	sh := contract.Shard{Queue: "q", Index: 1}
	for _, c := range []struct {
		v      string
		holder string
		ok     bool
	}{
		{"r1 1000 2000 3000", "r1", true},
		{"host a 1 1000 2000 3000", "host a 1", true},
		{"1000 2000 3000", "", false},
		{"r1 1000 2000", "", false},
		{"r1 x 2000 3000", "", false},
		{"r1 1000 -2 3000", "", false},
		{"", "", false},
	} {
		l, ok := parseShardLease(sh, c.v)
		if ok != c.ok || l.Holder != c.holder {
			t.Errorf("parseShardLease(%q) = %+v, %v", c.v, l, ok)
		}
		if ok && (l.Acquired != time.UnixMilli(1000) || l.Renewed != time.UnixMilli(2000) || l.TTL != 3*time.Second) {
			t.Errorf("parseShardLease(%q) = %+v", c.v, l)
		}
	}
}
