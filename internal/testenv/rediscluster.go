package testenv

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterConfigFile is the file each cluster node keeps its view of the
// cluster in, relative to the node's directory.
const clusterConfigFile = "nodes.conf"

// clusterFormTimeout bounds how long three fresh nodes may take to agree.
const clusterFormTimeout = 30 * time.Second

// RedisCluster is a Redis Cluster of three masters without replicas, each a
// private redis-server process on 127.0.0.1.
type RedisCluster struct {
	// Addrs are the host:port client addresses of the masters, in slot order:
	// Addrs[0] serves slots 0-5460, Addrs[1] 5461-10922, Addrs[2] 10923-16383.
	Addrs []string

	nodes    []*redisProc
	replicas []*redisProc // AddReplica's, stopped at cleanup too
}

// clusterSlotRanges splits the 16384 slots the way redis-cli does for three
// masters.
var clusterSlotRanges = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// StartRedisCluster starts a three-master Redis Cluster and returns once every
// node reports cluster_state:ok and all nodes agree on who serves which slots.
// It needs redis-server 7.0 or later on PATH even when REDIS_URL is set. The
// nodes are stopped at t's cleanup.
func StartRedisCluster(t testing.TB) *RedisCluster {
	t.Helper()
	bin, err := lookupRedisServer()
	if err != nil {
		t.Fatalf("testenv: %v; a Redis Cluster needs local redis-server processes (REDIS_URL cannot serve it): %s", err, redisInstallHint)
	}
	c := &RedisCluster{}
	t.Cleanup(func() {
		for _, n := range append(c.replicas, c.nodes...) {
			n.terminate()
			if t.Failed() {
				t.Logf("testenv: redis-server (cluster) %s log tail:\n%s", n.addr(), tailFile(n.logPath, 0, logTailLines))
			}
		}
	})
	for range clusterSlotRanges {
		n, err := startRedisProc(bin, t.TempDir(), true, nil, clusterNodeArgs)
		if err != nil {
			t.Fatalf("testenv: start redis-server cluster node: %v", err)
		}
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.addr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterFormTimeout)
	defer cancel()
	if err := c.form(ctx); err != nil {
		t.Fatalf("testenv: form redis cluster %v: %v", c.Addrs, err)
	}
	return c
}

// clusterNodeArgs are the arguments of every cluster node.
var clusterNodeArgs = []string{
	"--cluster-enabled", "yes",
	"--cluster-config-file", clusterConfigFile,
	"--save", "",
	"--appendonly", "no",
}

// AddReplica starts a node that replicates master i (Addrs[i]), and
// returns it once every master knows it and it holds its master's data.
// The replica can be frozen (Freeze) like any server this package
// started; it is stopped at t's cleanup.
func (c *RedisCluster) AddReplica(t testing.TB, i int) *Redis {
	t.Helper()
	bin, err := lookupRedisServer()
	if err != nil {
		t.Fatalf("testenv: %v: %s", err, redisInstallHint)
	}
	n, err := startRedisProc(bin, t.TempDir(), true, nil, clusterNodeArgs)
	if err != nil {
		t.Fatalf("testenv: start redis-server cluster replica: %v", err)
	}
	c.replicas = append(c.replicas, n)
	ctx, cancel := context.WithTimeout(context.Background(), clusterFormTimeout)
	defer cancel()
	if err := c.addReplica(ctx, n, i); err != nil {
		t.Fatalf("testenv: add a replica of %s to the cluster: %v", c.Addrs[i], err)
	}
	return &Redis{Addr: n.addr(), URL: "redis://" + n.addr() + "/0", proc: n}
}

func (c *RedisCluster) addReplica(ctx context.Context, n *redisProc, i int) error {
	master := redis.NewClient(&redis.Options{Addr: c.Addrs[i]})
	defer master.Close()
	node := redis.NewClient(&redis.Options{Addr: n.addr()})
	defer node.Close()
	id, err := master.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return fmt.Errorf("CLUSTER MYID: %w", err)
	}
	if err := master.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.port, n.busPort).Err(); err != nil {
		return fmt.Errorf("CLUSTER MEET %s: %w", n.addr(), err)
	}
	var last string
	if !waitFor(clusterFormTimeout, func() bool {
		nodes, err := node.ClusterNodes(ctx).Result()
		last = fmt.Sprint(nodes, err)
		return err == nil && strings.Contains(nodes, id)
	}) {
		return fmt.Errorf("the new node does not know its master; CLUSTER NODES: %s", last)
	}
	if err := node.Do(ctx, "CLUSTER", "REPLICATE", id).Err(); err != nil {
		return fmt.Errorf("CLUSTER REPLICATE %s: %w", id, err)
	}
	want := len(c.nodes) + len(c.replicas)
	if !waitFor(clusterFormTimeout, func() bool {
		info, err := node.Info(ctx, "replication").Result()
		last = fmt.Sprint(info, err)
		if err != nil || !strings.Contains(info, "master_link_status:up") || !strings.Contains(info, "master_sync_in_progress:0") {
			return false
		}
		for _, a := range c.Addrs {
			m := redis.NewClient(&redis.Options{Addr: a})
			ci, err := m.ClusterInfo(ctx).Result()
			_ = m.Close()
			if err != nil || !strings.Contains(ci, "cluster_known_nodes:"+strconv.Itoa(want)) || !strings.Contains(ci, "cluster_state:ok") {
				last = fmt.Sprint(a, ": ", ci, err)
				return false
			}
		}
		return true
	}) {
		return fmt.Errorf("the replica did not join within %s; last seen: %s", clusterFormTimeout, last)
	}
	return nil
}

// Client returns a cluster client for c, closed at t's cleanup.
func (c *RedisCluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: slices.Clone(c.Addrs)})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// form does what redis-cli --cluster create does, with go-redis alone:
// distinct config epochs, slot assignment, MEET, then waits for agreement.
func (c *RedisCluster) form(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.addr()})
		defer clients[i].Close()
	}
	for i, cl := range clients {
		// Distinct epochs spare the nodes the collision-resolution round
		// they would otherwise need before agreeing.
		if err := cl.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("node %s: CLUSTER SET-CONFIG-EPOCH: %w", c.nodes[i].addr(), err)
		}
		r := clusterSlotRanges[i]
		if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", r[0], r[1]).Err(); err != nil {
			return fmt.Errorf("node %s: CLUSTER ADDSLOTSRANGE %d %d: %w", c.nodes[i].addr(), r[0], r[1], err)
		}
	}
	for _, n := range c.nodes[1:] {
		if err := clients[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.port, n.busPort).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s: %w", n.addr(), err)
		}
	}

	want := c.expectedSlots()
	var lastProblem string
	formed := waitFor(clusterFormTimeout, func() bool {
		for i, cl := range clients {
			if problem := clusterNodeProblem(ctx, cl, len(c.nodes), want); problem != "" {
				lastProblem = fmt.Sprintf("node %s: %s", c.nodes[i].addr(), problem)
				return false
			}
		}
		return true
	})
	if !formed {
		return fmt.Errorf("not formed within %s; last seen: %s", clusterFormTimeout, lastProblem)
	}
	return nil
}

// expectedSlots is the slot map every node must report, normalised like
// slotMap.
func (c *RedisCluster) expectedSlots() string {
	parts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		r := clusterSlotRanges[i]
		parts[i] = fmt.Sprintf("%d-%d@%s", r[0], r[1], n.addr())
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// clusterNodeProblem returns why one node does not yet see the finished
// cluster, or "" when it does.
func clusterNodeProblem(ctx context.Context, cl *redis.Client, size int, wantSlots string) string {
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Sprintf("CLUSTER INFO: %v", err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			fields[k] = v
		}
	}
	if fields["cluster_state"] != "ok" {
		return "cluster_state:" + fields["cluster_state"]
	}
	if fields["cluster_known_nodes"] != strconv.Itoa(size) {
		return "cluster_known_nodes:" + fields["cluster_known_nodes"]
	}
	if fields["cluster_slots_ok"] != "16384" {
		return "cluster_slots_ok:" + fields["cluster_slots_ok"]
	}
	nodes, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return fmt.Sprintf("CLUSTER NODES: %v", err)
	}
	for _, flag := range []string{"handshake", "noaddr", "fail"} {
		if strings.Contains(nodes, flag) {
			return "a node is flagged " + flag
		}
	}
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return fmt.Sprintf("CLUSTER SLOTS: %v", err)
	}
	if got := slotMap(slots); got != wantSlots {
		return fmt.Sprintf("slots %s, want %s", got, wantSlots)
	}
	return ""
}

func slotMap(slots []redis.ClusterSlot) string {
	parts := make([]string, 0, len(slots))
	for _, s := range slots {
		addr := ""
		if len(s.Nodes) > 0 {
			addr = s.Nodes[0].Addr
		}
		parts = append(parts, fmt.Sprintf("%d-%d@%s", s.Start, s.End, addr))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
