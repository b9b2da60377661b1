package testenv

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// natsReadyTimeout bounds how long an embedded server may take to open
	// its listeners.
	natsReadyTimeout = 10 * time.Second
	// natsReadyPoll is the slice of time each readiness probe may take; the
	// server's own probe sleeps between checks only when given over 25 ms.
	natsReadyPoll = 50 * time.Millisecond
	// natsHealthyTimeout bounds how long JetStream may take to recover its
	// store (single server) or to rejoin and catch up (cluster node).
	natsHealthyTimeout = 30 * time.Second
	// natsReconnectWait replaces nats.go's 2 s default so clients come back
	// quickly after Restart and RestartNode.
	natsReconnectWait = 50 * time.Millisecond
)

// NATS is one embedded nats-server with JetStream, listening on 127.0.0.1 and
// storing in the test's temporary directory. It may be a node of a
// NATSCluster.
type NATS struct {
	name     string
	storeDir string
	log      *natsLog
	cluster  *natsClusterConfig // nil for a standalone server
	// configFile, when set, is a nats-server configuration file the server
	// starts from (its authorization, for instance); the listener, store
	// and JetStream stay the test's.
	configFile string

	mu   sync.Mutex
	port int            // client port; 0 until the first start picked one
	srv  *server.Server // the latest server, running or shut down
	up   bool
}

// natsClusterConfig is what makes a NATS a cluster node.
type natsClusterConfig struct {
	name   string
	port   int
	routes []*url.URL
}

// StartNATS starts a standalone embedded nats-server with JetStream on a free
// 127.0.0.1 port, its store in t.TempDir(), and shuts it down at t's cleanup.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	n, err := newNATS(t, "testenv", nil)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { n.cleanup(t) })
	if err := n.boot(); err != nil {
		t.Fatalf("testenv: start nats-server: %v", err)
	}
	n.waitHealthy(t)
	return n
}

// StartNATSFromConfig is StartNATS with the server configured from a
// nats-server configuration file first (server.ProcessConfigFile), so a test
// runs against the authorization a deployment uses. Variables the file takes
// from the environment must be set before.
func StartNATSFromConfig(t testing.TB, path string) *NATS {
	t.Helper()
	n, err := newNATS(t, "testenv", nil)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	n.configFile = path
	t.Cleanup(func() { n.cleanup(t) })
	if err := n.boot(); err != nil {
		t.Fatalf("testenv: start nats-server from %s: %v", path, err)
	}
	n.waitHealthy(t)
	return n
}

// Log is what the server logged so far (notices, warnings, errors).
func (n *NATS) Log() string {
	b, err := os.ReadFile(n.log.path)
	if err != nil {
		return fmt.Sprintf("(read nats-server log: %v)", err)
	}
	return string(b)
}

func newNATS(t testing.TB, name string, cluster *natsClusterConfig) (*NATS, error) {
	dir := t.TempDir()
	log, err := openNATSLog(filepath.Join(dir, "nats.log"))
	if err != nil {
		return nil, err
	}
	return &NATS{
		name:     name,
		storeDir: filepath.Join(dir, "store"),
		log:      log,
		cluster:  cluster,
	}, nil
}

// URL is the client URL, stable across Restart.
func (n *NATS) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
}

// Server is the embedded server. After Restart it is a new *server.Server.
func (n *NATS) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Connect opens a client connection, closed at t's cleanup. It reconnects
// without limit every 50 ms unless opts say otherwise, so a connection
// survives Restart.
func (n *NATS) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, n.URL(), opts)
}

// JetStream returns a JetStream handle on a new connection, closed at t's
// cleanup.
func (n *NATS) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return newJetStream(t, n.Connect(t))
}

// Shutdown stops the server and waits for it; the store is kept for Restart.
// It does nothing when the server is already down.
func (n *NATS) Shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up {
		return
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	n.up = false
}

// Restart starts the server again (shutting it down first if it is up) on the
// same port and store, and waits until JetStream has recovered its streams.
// A standalone server only; cluster nodes restart through the cluster.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	n.Shutdown()
	if err := n.boot(); err != nil {
		t.Fatalf("testenv: restart nats-server %s: %v", n.name, err)
	}
	n.waitHealthy(t)
}

// boot creates and starts a server and waits for its listeners. The first
// boot picks the client port with freePorts (outside the kernel's
// ephemeral range, so a restart finds it free) and picks again when another
// process took it first.
func (n *NATS) boot() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.port != 0 {
		return n.bootLocked()
	}
	var err error
	for range startAttempts {
		ports, perr := freePorts(1)
		if perr != nil {
			return perr
		}
		n.port = ports[0]
		if err = n.bootLocked(); !errors.Is(err, errBindConflict) {
			break
		}
	}
	if err != nil {
		n.port = 0
	}
	return err
}

// bootLocked is boot on n.port, with n.mu held.
func (n *NATS) bootLocked() error {
	if n.up {
		return fmt.Errorf("nats-server %s is already running", n.name)
	}
	opts := &server.Options{}
	if n.configFile != "" {
		var err error
		if opts, err = server.ProcessConfigFile(n.configFile); err != nil {
			return fmt.Errorf("nats-server %s: %w", n.name, err)
		}
	}
	opts.ServerName, opts.Host, opts.Port = n.name, "127.0.0.1", n.port
	opts.JetStream, opts.StoreDir = true, n.storeDir
	opts.NoLog, opts.NoSigs = true, true
	if c := n.cluster; c != nil {
		opts.Cluster = server.ClusterOpts{Name: c.name, Host: "127.0.0.1", Port: c.port}
		opts.Routes = c.routes
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("configure nats-server %s: %w", n.name, err)
	}
	logStart := n.log.size()
	fatalsBefore := n.log.fatalCount()
	srv.SetLogger(n.log, false, false)
	srv.Start()
	// A server that logged a fatal error (a port in use, a bad cluster
	// setup) never becomes ready; notice that at once instead of waiting out
	// the whole timeout.
	var fatal bool
	ready := waitFor(natsReadyTimeout, func() bool {
		fatal = n.log.fatalCount() != fatalsBefore
		return fatal || srv.ReadyForConnections(natsReadyPoll)
	})
	if !ready || fatal {
		srv.Shutdown()
		srv.WaitForShutdown()
		tail := tailFile(n.log.path, logStart, logTailLines)
		cause := fmt.Errorf("not ready for connections within %s", natsReadyTimeout)
		if fatal {
			cause = errors.New("fatal error at start")
		}
		if strings.Contains(strings.ToLower(tail), "address already in use") {
			cause = errBindConflict
		}
		return fmt.Errorf("nats-server %s: %w\n--- log tail (%s) ---\n%s", n.name, cause, n.log.path, tail)
	}
	n.srv = srv
	n.up = true
	return nil
}

// running returns the server if it is up, else nil.
func (n *NATS) running() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up {
		return nil
	}
	return n.srv
}

// healthProblem returns what the server's health check reports, or "" when
// JetStream is up, current with its meta leader (cluster) and every stream
// and consumer it holds is recovered and caught up.
func (n *NATS) healthProblem() string {
	srv := n.running()
	if srv == nil {
		return n.name + " is not running"
	}
	h := srv.Healthz(nil)
	if h.Status == "ok" {
		return ""
	}
	return fmt.Sprintf("%s: %s %s", n.name, h.Status, h.Error)
}

func (n *NATS) waitHealthy(t testing.TB) {
	t.Helper()
	var problem string
	Eventually(t, natsHealthyTimeout, func() bool {
		problem = n.healthProblem()
		return problem == ""
	}, "nats-server %s healthy (last: %s)", n.name, lazyString(func() string { return problem }))
}

func (n *NATS) cleanup(t testing.TB) {
	n.Shutdown()
	if t.Failed() {
		t.Logf("testenv: nats-server %s log tail:\n%s", n.name, tailFile(n.log.path, 0, logTailLines))
	}
	if err := n.log.close(); err != nil {
		t.Errorf("testenv: close nats-server %s log: %v", n.name, err)
	}
}

func connect(t testing.TB, urls string, opts []nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(natsReconnectWait),
	}, opts...)
	nc, err := nats.Connect(urls, all...)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func newJetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testenv: jetstream: %v", err)
	}
	return js
}

// natsLog is a server.Logger writing notices, warnings and errors of one
// embedded server (across restarts) to a file, so a failing test can show
// them. Debug and trace output is dropped.
type natsLog struct {
	path string

	mu     sync.Mutex
	f      *os.File // nil once closed
	fatals int      // Fatalf calls so far
}

func openNATSLog(path string) (*natsLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open nats-server log: %w", err)
	}
	return &natsLog{path: path, f: f}, nil
}

func (l *natsLog) write(level, format string, v []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	// Losing a log line must not disturb the server under test.
	_, _ = fmt.Fprintf(l.f, "%s [%s] %s\n", time.Now().Format("15:04:05.000"), level, fmt.Sprintf(format, v...))
}

func (l *natsLog) fatalCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatals
}

func (l *natsLog) size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0
	}
	fi, err := l.f.Stat()
	if err != nil {
		return 0
	}
	return fi.Size()
}

func (l *natsLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	if err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}

func (l *natsLog) Noticef(format string, v ...any) { l.write("INF", format, v) }
func (l *natsLog) Warnf(format string, v ...any)   { l.write("WRN", format, v) }
func (l *natsLog) Fatalf(format string, v ...any) {
	l.write("FTL", format, v)
	l.mu.Lock()
	l.fatals++
	l.mu.Unlock()
}
func (l *natsLog) Errorf(format string, v ...any) { l.write("ERR", format, v) }
func (l *natsLog) Debugf(string, ...any)          {}
func (l *natsLog) Tracef(string, ...any)          {}

// NATSConfigWithVars writes a copy of the nats-server configuration file at
// path into t's temporary directory, with vars defined at its top, and
// returns the copy's path. The file's $NAME references find them there
// before the environment: a test that passes the passwords so needs no
// t.Setenv, and may run in parallel.
func NATSConfigWithVars(t testing.TB, path string, vars map[string]string) string {
	t.Helper()
	conf, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		fmt.Fprintf(&b, "%s: %s\n", name, strconv.Quote(vars[name]))
	}
	b.Write(conf)
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(out, []byte(b.String()), 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return out
}
