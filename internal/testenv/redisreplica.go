package testenv

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// replicaSyncTimeout bounds how long a replica may take to connect to its
// primary and load its data set.
const replicaSyncTimeout = 20 * time.Second

// StartRedisReplica starts a private redis-server that replicates primary
// (REPLICAOF), and returns once its link is up and it holds the primary's
// data set. primary must be a server this package started. The replica is
// stopped at t's cleanup.
func StartRedisReplica(t testing.TB, primary *Redis) *Redis {
	t.Helper()
	primary.mustOwn(t, "StartRedisReplica's primary")
	r := StartRedis(t, WithPrivateServer())
	r.Follow(t, primary)
	return r
}

// Follow makes r a replica of primary and waits until its link is up and
// the initial synchronisation is done. r drops what it held.
func (r *Redis) Follow(t testing.TB, primary *Redis) {
	t.Helper()
	r.mustOwn(t, "Follow")
	host, port, err := net.SplitHostPort(primary.Addr)
	if err != nil {
		t.Fatalf("testenv: primary address %q: %v", primary.Addr, err)
	}
	if reply, err := commandRaw(r.Addr, "REPLICAOF", host, port); err != nil || reply != "+OK" {
		t.Fatalf("testenv: REPLICAOF %s on %s: %q %v", primary.Addr, r.Addr, reply, err)
	}
	var last string
	if !waitFor(replicaSyncTimeout, func() bool {
		last, _ = commandRaw(r.Addr, "INFO", "replication")
		return strings.Contains(last, "master_link_status:up") && strings.Contains(last, "master_sync_in_progress:0")
	}) {
		t.Fatalf("testenv: %s did not follow %s within %s; INFO replication:\n%s", r.Addr, primary.Addr, replicaSyncTimeout, last)
	}
}

// Detach makes replica r stop following its primary (REPLICAOF NO ONE):
// it keeps the data it has and takes writes from now on. Writes the
// primary takes afterwards never reach it, so it lags more and more; a
// client pointed at it (RedisSwitch.Point) sees it as a replica promoted
// by a failover.
func (r *Redis) Detach(t testing.TB) {
	t.Helper()
	r.mustOwn(t, "Detach")
	if reply, err := commandRaw(r.Addr, "REPLICAOF", "NO", "ONE"); err != nil || reply != "+OK" {
		t.Fatalf("testenv: REPLICAOF NO ONE on %s: %q %v", r.Addr, reply, err)
	}
}

// RedisSwitch stands for the address clients use to reach "the Redis
// primary" (a DNS name, a Sentinel's answer): every new connection of a
// client built on its Options goes to the server it points at now.
// Connections already open stay where they are, as they would after a
// real failover, until that server closes them.
type RedisSwitch struct {
	target atomic.Pointer[Redis]
}

// NewRedisSwitch returns a switch pointing at r.
func NewRedisSwitch(r *Redis) *RedisSwitch {
	s := &RedisSwitch{}
	s.target.Store(r)
	return s
}

// Point makes new connections go to r.
func (s *RedisSwitch) Point(r *Redis) { s.target.Store(r) }

// Options returns go-redis options for the server the switch points at
// (its database), whose dialer follows the switch.
func (s *RedisSwitch) Options() *redis.Options {
	opts := s.target.Load().Options()
	opts.Dialer = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, s.target.Load().Addr)
	}
	return opts
}

// Client returns a client on the switch, closed at t's cleanup.
func (s *RedisSwitch) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(s.Options())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Freeze stops the server process (SIGSTOP) until Thaw: its connections
// stay open and nothing it should do happens, as with a host that hangs.
// A replica frozen acknowledges nothing; its primary keeps taking writes.
func (r *Redis) Freeze(t testing.TB) {
	t.Helper()
	r.mustOwn(t, "Freeze")
	if err := r.proc.freeze(true); err != nil {
		t.Fatalf("testenv: freeze %s: %v", r.Addr, err)
	}
}

// Thaw continues a server Freeze stopped.
func (r *Redis) Thaw(t testing.TB) {
	t.Helper()
	r.mustOwn(t, "Thaw")
	if err := r.proc.freeze(false); err != nil {
		t.Fatalf("testenv: thaw %s: %v", r.Addr, err)
	}
}
