package testenv

import (
	"testing"
	"time"
)

// TestRedisReplicaDetachedAndPromoted: a replica holds what its primary
// took; frozen it acknowledges nothing; detached it keeps what it had,
// misses what the primary takes afterwards and takes writes itself; a
// client on a switch pointed at it then reads and writes it.
func TestRedisReplicaDetachedAndPromoted(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	primary := StartRedis(t, WithPrivateServer())
	replica := StartRedisReplica(t, primary)
	sw := NewRedisSwitch(primary)
	c, rc := sw.Client(t), replica.Client(t)

	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 with the replica following: %d, %v", n, err)
	}
	if rc.Get(ctx, "before").Val() != "1" {
		t.Fatal("the replica lacks a write WAIT confirmed")
	}

	replica.Freeze(t)
	if err := c.Set(ctx, "frozen", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 200*time.Millisecond).Result(); err != nil || n != 0 {
		t.Fatalf("WAIT 1 with the replica frozen: %d, %v; want 0", n, err)
	}
	replica.Thaw(t)
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after the thaw: %d, %v", n, err)
	}

	replica.Detach(t)
	if err := c.Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := rc.Exists(ctx, "after").Val(); n != 0 {
		t.Fatal("a detached replica got a write of its former primary")
	}

	sw.Point(replica)
	primary.Kill(t)
	Eventually(t, 10*time.Second, func() bool { return c.Set(ctx, "promoted", "1", 0).Err() == nil }, "a write on the promoted replica through the switch")
	if c.Get(ctx, "before").Val() != "1" || c.Exists(ctx, "after").Val() != 0 {
		t.Fatal("the switch does not reach the promoted replica's data")
	}
}
