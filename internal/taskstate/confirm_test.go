package taskstate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestReadOutboxConfirmed: fires written on the store's other connections
// are read and confirmed on one connection of its own. With the replica
// frozen the WAIT times out (none acknowledged); once it runs again a
// confirmed read returns only after it applied every record read, with
// its task and watermark: read from the replica at once, without waiting.
func TestReadOutboxConfirmed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := testenv.StartRedis(t, testenv.WithPrivateServer())
	replica := testenv.StartRedisReplica(t, primary)
	s, onReplica := New(primary.Client(t)), replica.Client(t)

	replica.Freeze(t)
	var prev time.Time
	for i := 1; i <= 3; i++ {
		mustFire(t, s, tickFire("c", "default", tickAt(i), prev), StatusFired)
		prev = tickAt(i)
	}
	start := time.Now()
	read, err := s.ReadOutboxConfirmed(ctx, testPrefix, "default", "relay-1", time.Minute, "", 10, 1, 300*time.Millisecond)
	if err != nil || !read.Owned || len(read.Records) != 3 || read.Acked != 0 {
		t.Fatalf("confirmed read with the replica frozen: owned %v, %d records, %d acked, %v; want 3 records, none acked", read.Owned, len(read.Records), read.Acked, err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("WAIT returned after %s, before its timeout, with the replica frozen", waited)
	}

	replica.Thaw(t)
	read, err = s.ReadOutboxConfirmed(ctx, testPrefix, "default", "relay-1", time.Minute, "", 10, 1, 10*time.Second)
	if err != nil || !read.Owned || len(read.Records) != 3 || read.Acked != 1 {
		t.Fatalf("confirmed read with the replica back: owned %v, %d records, %d acked, %v; want 3 records, 1 acked", read.Owned, len(read.Records), read.Acked, err)
	}
	for i := 1; i <= 3; i++ {
		if n := onReplica.Exists(ctx, Keys("default").Task(taskIDFor("c", tickAt(i)))).Val(); n != 1 {
			t.Errorf("the replica lacks the task of tick %d after WAIT confirmed its record", i)
		}
	}
	if wm := onReplica.Get(ctx, Own(testPrefix, "default").Watermark("c")).Val(); wm == "" {
		t.Error("the replica lacks the watermark after WAIT confirmed its record")
	}

	// Another relay's read renews nothing and returns nothing.
	if read, err := s.ReadOutboxConfirmed(ctx, testPrefix, "default", "relay-2", time.Minute, "", 10, 1, time.Second); err != nil || read.Owned || len(read.Records) != 0 {
		t.Fatalf("read by a relay without the lease: owned %v, %d records, %v", read.Owned, len(read.Records), err)
	}
	// An empty script cache: the renewal runs again, still after the read.
	if err := primary.Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if read, err := s.ReadOutboxConfirmed(ctx, testPrefix, "default", "relay-1", time.Minute, "", 10, 1, 10*time.Second); err != nil || !read.Owned || read.Acked != 1 {
		t.Fatalf("confirmed read on an empty script cache: owned %v, %d acked, %v", read.Owned, read.Acked, err)
	}
	if rep, err := s.OutboxReplication(ctx, testPrefix, "default"); err != nil || rep.Role != "master" || rep.Online != 1 || rep.Connected != 1 {
		t.Fatalf("OutboxReplication = %+v, %v; want a master with one online replica", rep, err)
	}
}

// TestReadOutboxConfirmedRefused: a user without WAIT gets the read and
// ErrWaitRefused; without INFO, ErrInfoRefused.
func TestReadOutboxConfirmedRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	admin := r.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "nowait", "on", ">pw", "~*", "+@all", "-wait", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	opts := r.Options()
	opts.Username, opts.Password = "nowait", "pw"
	rc := redis.NewClient(opts)
	t.Cleanup(func() { _ = rc.Close() })
	s := New(rc)
	mustFire(t, s, tickFire("c", "default", tickAt(1), time.Time{}), StatusFired)
	read, err := s.ReadOutboxConfirmed(ctx, testPrefix, "default", "relay-1", time.Minute, "", 10, 1, time.Second)
	if !errors.Is(err, ErrWaitRefused) || !read.Owned || len(read.Records) != 1 {
		t.Fatalf("WAIT refused: owned %v, %d records, %v; want the record and ErrWaitRefused", read.Owned, len(read.Records), err)
	}
	if _, err := s.OutboxReplication(ctx, testPrefix, "default"); !errors.Is(err, ErrInfoRefused) {
		t.Fatalf("INFO refused: %v; want ErrInfoRefused", err)
	}
}

// TestReadOutboxConfirmedCluster: on a cluster the read and the WAIT go to
// the master of the queue's slot, whatever node the client knows first.
func TestReadOutboxConfirmedCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cc := testenv.StartRedisCluster(t).Client(t)
	s := New(cc)
	for _, q := range []string{"default", "alpha", "beta"} {
		mustFire(t, s, tickFire("c", q, tickAt(1), time.Time{}), StatusFired)
		read, err := s.ReadOutboxConfirmed(ctx, testPrefix, q, "relay-1", time.Minute, "", 10, 0, time.Second)
		if err != nil || !read.Owned || len(read.Records) != 1 {
			t.Fatalf("queue %s: owned %v, %d records, %v", q, read.Owned, len(read.Records), err)
		}
		// No replicas: WAIT 1 answers 0 when it times out, and is never
		// "cannot be used with replica instances" (it reached a master).
		read, err = s.ReadOutboxConfirmed(ctx, testPrefix, q, "relay-1", time.Minute, "", 10, 1, 50*time.Millisecond)
		if err != nil || read.Acked != 0 {
			t.Fatalf("queue %s: WAIT on the slot's master: %d acked, %v", q, read.Acked, err)
		}
		m, err := s.OutboxMaster(ctx, testPrefix, q)
		if err != nil || m == "" {
			t.Fatalf("queue %s: master %q, %v", q, m, err)
		}
	}
}

// TestReadOutboxConfirmedUnsupportedClient: a client whose connections
// cannot be held for WAIT (a Ring) still reads, unconfirmed.
func TestReadOutboxConfirmedUnsupportedClient(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": r.Addr}, DB: r.DB})
	t.Cleanup(func() { _ = ring.Close() })
	s := New(ring)
	mustFire(t, s, tickFire("c", "default", tickAt(1), time.Time{}), StatusFired)
	read, err := s.ReadOutboxConfirmed(context.Background(), testPrefix, "default", "relay-1", time.Minute, "", 10, 1, time.Second)
	if !errors.Is(err, ErrWaitRefused) || !errors.Is(err, ErrWaitUnsupported) || !read.Owned || len(read.Records) != 1 {
		t.Fatalf("owned %v, %d records, %v; want the record, unconfirmed", read.Owned, len(read.Records), err)
	}
}
