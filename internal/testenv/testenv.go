// Package testenv starts real Redis and NATS servers for tests: private
// redis-server processes (single node or a three-master cluster) and embedded
// nats-server instances with JetStream (single node or a routed cluster). Every
// server lives in the test's temporary directory, listens only on 127.0.0.1 and
// is stopped and waited for at t.Cleanup, so tests can run in parallel and leave
// nothing behind.
//
// When REDIS_URL is set, StartRedis uses that server instead of starting one and
// isolates each call on its own logical database (1..15), claimed across test
// processes through keys in database 0. Redis clusters always run locally.
//
// StartNATSProcess runs nats-server as a process of its own (the binary
// BuildNATSServer builds from the module's dependency), for benchmarks that
// measure the server's CPU apart from the test's. NewCPUGroup makes a
// cgroup that limits the processes started in it to a share of a core
// (root, or a delegated cgroup v2; ErrNoCPUGroup elsewhere).
//
// StreamMsgs reads every message of a JetStream stream, StreamMsgCount
// counts them; RedisInfo and its forms (RedisPID, RedisCPU,
// RedisCommandStats) read a Redis server's INFO; ProcCPU, ProcFaults,
// Preemptions and SelfCPU read a process's CPU time and faults for
// benchmarks. AsynqClient is an asynq client closed with the test;
// RecoverWithAsynq and AggregateWithAsynq run asynq's own recoverer and
// aggregator over a queue, for tests that compare with asynq.
//
// StartProxy puts a TCP proxy the test can cut (blackhole or drop) between
// a client and a server, to stall or break a connection.
//
// It also owns Eventually, the project's one way for a test to wait for a
// condition (WaitFor is its form that reports instead of failing), Settle,
// its form for loops on a manual clock, and Context, a context bounded so
// that a hang fails the test instead of stalling the package.
//
// It never mocks a server and never touches a server it did not start, except
// the one named by REDIS_URL. It is for tests only; non-test code must not
// import it.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pollInterval is how often Eventually and the internal waits re-check a
// cheap condition: short enough that tests do not idle, long enough not to
// spin. A condition that takes longer (one that runs a command, or reads a
// stream) waits as long as it took before it is checked again, so a wait
// keeps at most half of a core busy with its condition, whatever it does:
// a suite of tests waiting on commands would otherwise spawn processes back
// to back and starve the replicas under test of CPU.
const pollInterval = 10 * time.Millisecond

// Eventually polls cond every ~10ms (or, for a slow cond, as long as it
// takes) until it returns true or timeout passes, then fails the test with
// the formatted message. It is the project's one way to wait for a
// condition; use it instead of time.Sleep.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if waitFor(timeout, cond) {
		return
	}
	t.Fatalf("condition not met within %s: %s", timeout, fmt.Sprintf(format, args...))
}

// Context returns a context that ends after d or when the test ends,
// whichever comes first.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond like Eventually and reports whether it became true
// before timeout, for a caller that goes on either way: a benchmark for
// which a condition not met is a finding (a deployment that cannot keep
// up), not a failure.
func WaitFor(timeout time.Duration, cond func() bool) bool { return waitFor(timeout, cond) }

func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		began := time.Now()
		if cond() {
			return true
		}
		now := time.Now()
		if now.After(deadline) {
			return false
		}
		// The last check is always made at or after the deadline.
		time.Sleep(min(max(pollInterval, now.Sub(began)), deadline.Sub(now)+time.Millisecond))
	}
}

// lazyString defers formatting to when a failure message is printed, so a
// message can report the last state a wait observed.
type lazyString func() string

func (f lazyString) String() string { return f() }

// freePorts returns n distinct loopback TCP ports that were free a moment ago.
// All n listeners are held open together so the ports differ from each other;
// another process can still take one before the caller binds it, which is why
// callers retry on a bind conflict.
//
// The ports are picked below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), where the kernel never puts the local end
// of an outgoing connection: a server stopped and started again on its port
// (a restart test) would otherwise find it taken by any client connection
// opened meanwhile. Only where that range leaves no room are they picked by
// the kernel.
func freePorts(n int) ([]int, error) {
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	low, high := fixedPortRange()
	ports := make([]int, 0, n)
	for len(ports) < n {
		addr := "127.0.0.1:0"
		if high > low {
			addr = "127.0.0.1:" + strconv.Itoa(low+rand.IntN(high-low))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if high > low && errors.Is(err, syscall.EADDRINUSE) {
				continue
			}
			return nil, fmt.Errorf("reserve loopback port: %w", err)
		}
		listeners = append(listeners, l)
		a, ok := l.Addr().(*net.TCPAddr)
		if !ok {
			return nil, fmt.Errorf("reserve loopback port: unexpected address %v", l.Addr())
		}
		if high > low && !claimPort(a.Port) {
			continue
		}
		ports = append(ports, a.Port)
	}
	return ports, nil
}

// portClaims holds a lock, for the life of this process, on every port
// freePorts picked from the fixed range. Test processes run side by side and
// pick from the same range, and a server stopped to be restarted on its
// port leaves it free meanwhile: without the claim another test process
// could pick it then, and the restart would find it taken. A port another
// process holds, or this one handed out already, is not picked again. The
// locks go with the process, so a killed test run leaves no claim behind
// (the empty lock files stay, one per port ever picked).
var portClaims struct {
	sync.Mutex
	held map[int]*os.File
}

// claimPort claims port for this process; false when it is claimed already,
// here or by another process. Where no lock file can be made, the claim is
// granted: the port was free to listen on, as before claims existed.
func claimPort(port int) bool {
	portClaims.Lock()
	defer portClaims.Unlock()
	if _, ok := portClaims.held[port]; ok {
		return false
	}
	dir := filepath.Join(os.TempDir(), "cronstream-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return false
	}
	if portClaims.held == nil {
		portClaims.held = map[int]*os.File{}
	}
	portClaims.held[port] = f
	return true
}

// fixedPortRange is where freePorts picks: [low, high), from 10000 up to
// the start of the kernel's ephemeral range; an empty range when that
// start is unknown or leaves fewer than 1000 ports.
func fixedPortRange() (low, high int) {
	const first = 10000
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	start, err := strconv.Atoi(f[0])
	if err != nil || start-first < 1000 {
		return 0, 0
	}
	return first, start
}

// tailFile returns the last maxLines lines of the file at path, starting no
// earlier than byte offset from, for failure messages.
func tailFile(path string, from int64, maxLines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if from > 0 && from <= int64(len(data)) {
		data = data[from:]
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return "(empty log)"
	}
	return strings.Join(lines, "\n")
}

// errBindConflict marks a start that failed only because a port picked by
// freePorts was taken in the meantime; callers pick new ports and retry.
var errBindConflict = errors.New("port already in use")

// startAttempts bounds retries after bind conflicts.
const startAttempts = 4
