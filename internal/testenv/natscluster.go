package testenv

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsClusterName is the cluster name of every NATSCluster; clusters of
// different tests never meet because their routes name only their own ports.
const natsClusterName = "testenv"

// natsLeaderTimeout bounds a meta or stream leader election, which in
// nats-server takes up to its 9 s maximum election timeout plus catch-up.
const natsLeaderTimeout = 30 * time.Second

// NATSCluster is a cluster of embedded nats-servers with JetStream, routed
// over 127.0.0.1. Node i is named "n<i>".
type NATSCluster struct {
	Nodes []*NATS

	t testing.TB // for StopNode, whose signature has no testing.TB
}

// StartNATSCluster starts size (at least 2, usually 3) routed JetStream servers
// and returns once they agree on a JetStream meta leader that sees every
// node as current, so replicated streams can be created at once. All nodes
// are shut down at t's cleanup.
func StartNATSCluster(t testing.TB, size int) *NATSCluster {
	t.Helper()
	if size < 2 {
		// nats-server refuses clustered JetStream without routes.
		t.Fatalf("testenv: StartNATSCluster size %d, want at least 2 (use StartNATS for one server)", size)
	}
	c := &NATSCluster{t: t}
	var lastErr error
	for attempt := 0; attempt < startAttempts && c.Nodes == nil; attempt++ {
		nodes, err := startNATSNodes(t, size)
		if err == nil {
			c.Nodes = nodes
			break
		}
		lastErr = err
		if !errors.Is(err, errBindConflict) {
			break
		}
	}
	if c.Nodes == nil {
		t.Fatalf("testenv: start nats cluster of %d: %v", size, lastErr)
	}
	c.WaitMetaLeader(t)
	return c
}

// startNATSNodes starts one cluster on freshly picked route ports and fresh
// stores. On a failure every node started so far is shut down (cleanup closes
// the logs), so the caller can retry with new ports and stores.
func startNATSNodes(t testing.TB, size int) ([]*NATS, error) {
	ports, err := freePorts(size)
	if err != nil {
		return nil, err
	}
	nodes := make([]*NATS, size)
	for i := range nodes {
		cfg := &natsClusterConfig{name: natsClusterName, port: ports[i]}
		for j, p := range ports {
			if j != i {
				cfg.routes = append(cfg.routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)})
			}
		}
		n, err := newNATS(t, fmt.Sprintf("n%d", i), cfg)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { n.cleanup(t) })
		nodes[i] = n
	}
	for _, n := range nodes {
		if err := n.boot(); err != nil {
			for _, m := range nodes {
				m.Shutdown()
			}
			return nil, err
		}
	}
	return nodes, nil
}

// URLs is the comma-separated list of every node's client URL, the form
// nats.Connect accepts.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// Connect opens a client connection to any node, closed at t's cleanup. It
// reconnects without limit every 50 ms unless opts say otherwise.
func (c *NATSCluster) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, c.URLs(), opts)
}

// JetStream returns a JetStream handle on a new connection to the cluster,
// closed at t's cleanup.
func (c *NATSCluster) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return newJetStream(t, c.Connect(t))
}

// StopNode shuts node i down abruptly (no leadership hand-over, as in a
// crash) and waits for it; its store is kept for RestartNode.
func (c *NATSCluster) StopNode(i int) {
	if i < 0 || i >= len(c.Nodes) {
		c.t.Errorf("testenv: StopNode(%d): cluster has nodes 0..%d", i, len(c.Nodes)-1)
		return
	}
	c.Nodes[i].Shutdown()
}

// RestartNode starts node i again (shutting it down first if it is up) on the
// same ports and store, and waits until a meta leader exists, the node is
// current with it and passes its health check, and its copy of every stream
// it holds has reached the last sequence of that stream's leader.
func (c *NATSCluster) RestartNode(t testing.TB, i int) {
	t.Helper()
	if i < 0 || i >= len(c.Nodes) {
		t.Fatalf("testenv: RestartNode(%d): cluster has nodes 0..%d", i, len(c.Nodes)-1)
	}
	n := c.Nodes[i]
	n.Shutdown()
	if err := n.boot(); err != nil {
		t.Fatalf("testenv: restart nats node %s: %v", n.name, err)
	}
	c.WaitMetaLeader(t)
	n.waitHealthy(t)
	// A follower's health check can pass before the leader has sent it what
	// it missed, so compare its streams with their leaders' directly.
	var problem string
	Eventually(t, natsHealthyTimeout, func() bool {
		problem = c.catchUpProblem(i)
		return problem == ""
	}, "node %s caught up with its stream leaders (last: %s)", n.name, lazyString(func() string { return problem }))
}

// RestartAll stops every node (a whole-cluster outage: those still up are
// shut down abruptly) and starts them all again on the same ports and
// stores. The nodes boot together, because one node of a stopped cluster
// has no quorum to elect a meta leader; it returns once a meta leader that
// every node is current with exists and each node passes its health check,
// whose stream checks need the stream leaders elected and caught up.
func (c *NATSCluster) RestartAll(t testing.TB) {
	t.Helper()
	for _, n := range c.Nodes {
		n.Shutdown()
	}
	for _, n := range c.Nodes {
		if err := n.boot(); err != nil {
			t.Fatalf("testenv: restart nats node %s of the stopped cluster: %v", n.name, err)
		}
	}
	c.WaitMetaLeader(t)
	for _, n := range c.Nodes {
		n.waitHealthy(t)
	}
}

// catchUpProblem returns why node i's streams are behind their leaders, or ""
// when every stream it holds has its leader's last sequence.
func (c *NATSCluster) catchUpProblem(i int) string {
	srv := c.Nodes[i].running()
	if srv == nil {
		return c.Nodes[i].name + " is not running"
	}
	mine, err := streamLastSeqs(srv)
	if err != nil {
		return fmt.Sprintf("%s: %v", c.Nodes[i].name, err)
	}
	for key, seq := range mine {
		leader := -1
		for j, m := range c.Nodes {
			if s := m.running(); s != nil && s.JetStreamIsStreamLeader(key.account, key.stream) {
				leader = j
				break
			}
		}
		if leader < 0 {
			return fmt.Sprintf("stream %s > %s has no leader", key.account, key.stream)
		}
		if leader == i {
			continue
		}
		theirs, err := streamLastSeqs(c.Nodes[leader].running())
		if err != nil {
			return fmt.Sprintf("%s: %v", c.Nodes[leader].name, err)
		}
		if want := theirs[key]; seq < want {
			return fmt.Sprintf("stream %s > %s at sequence %d, leader %s at %d", key.account, key.stream, seq, c.Nodes[leader].name, want)
		}
	}
	return ""
}

type streamKey struct{ account, stream string }

// streamLastSeqs reports the last sequence of every stream replica srv holds.
func streamLastSeqs(srv *server.Server) (map[streamKey]uint64, error) {
	if srv == nil {
		return nil, errors.New("not running")
	}
	jsz, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		return nil, fmt.Errorf("jsz: %w", err)
	}
	seqs := map[streamKey]uint64{}
	for _, acc := range jsz.AccountDetails {
		for _, s := range acc.Streams {
			seqs[streamKey{acc.Id, s.Name}] = s.State.LastSeq
		}
	}
	return seqs, nil
}

// WaitMetaLeader waits until every running node names the same JetStream meta
// leader and is current with it, and the leader sees every running node as a
// current peer.
func (c *NATSCluster) WaitMetaLeader(t testing.TB) {
	t.Helper()
	var problem string
	Eventually(t, natsLeaderTimeout, func() bool {
		problem = c.metaProblem()
		return problem == ""
	}, "JetStream meta leader agreed by all running nodes (last: %s)", lazyString(func() string { return problem }))
}

func (c *NATSCluster) metaProblem() string {
	var leader string
	var leaderSrv *server.Server
	var running []string
	for _, n := range c.Nodes {
		srv := n.running()
		if srv == nil {
			continue
		}
		running = append(running, n.name)
		jsz, err := srv.Jsz(nil)
		if err != nil {
			return fmt.Sprintf("%s: jsz: %v", n.name, err)
		}
		if jsz.Meta == nil || jsz.Meta.Leader == "" {
			return n.name + " sees no meta leader"
		}
		if leader == "" {
			leader = jsz.Meta.Leader
		} else if jsz.Meta.Leader != leader {
			return fmt.Sprintf("%s sees meta leader %s, others %s", n.name, jsz.Meta.Leader, leader)
		}
		if !srv.JetStreamIsCurrent() {
			return n.name + " is not current with the meta leader"
		}
		if n.name == leader {
			leaderSrv = srv
		}
	}
	if len(running) == 0 {
		return "no node is running"
	}
	if leaderSrv == nil || !leaderSrv.JetStreamIsLeader() {
		return fmt.Sprintf("meta leader %s is not a running node that knows it leads", leader)
	}
	jsz, err := leaderSrv.Jsz(nil)
	if err != nil || jsz.Meta == nil {
		return fmt.Sprintf("leader %s: jsz: %v", leader, err)
	}
	for _, name := range running {
		if name == leader {
			continue
		}
		var seen bool
		for _, p := range jsz.Meta.Replicas {
			if p.Name == name && p.Current && !p.Offline {
				seen = true
			}
		}
		if !seen {
			return fmt.Sprintf("meta leader %s does not see %s as a current peer", leader, name)
		}
	}
	return ""
}

// StreamLeader returns the index of the running node that leads stream (in
// the global account), waiting for an election if none leads right now.
func (c *NATSCluster) StreamLeader(t testing.TB, stream string) int {
	t.Helper()
	leader := -1
	Eventually(t, natsLeaderTimeout, func() bool {
		for i, n := range c.Nodes {
			if srv := n.running(); srv != nil && srv.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
				leader = i
				return true
			}
		}
		return false
	}, "a running node leads stream %q", stream)
	return leader
}
