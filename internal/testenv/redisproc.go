package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// redisStartTimeout bounds how long a redis-server may take to answer PING,
	// including loading an AOF after a restart.
	redisStartTimeout = 15 * time.Second
	// redisStopTimeout bounds a graceful stop before SIGKILL.
	redisStopTimeout = 10 * time.Second
	// logTailLines is how much of a server log goes into a failure message.
	logTailLines = 30
)

// redisInstallHint is the advice given when redis-server is missing.
const redisInstallHint = "install it (apt-get install -y redis-server)"

// redisProc is one redis-server process we own: its fixed port(s), directory and
// arguments, and the running child if any. One redisProc may be started and
// stopped many times; every start reuses the same port and directory.
type redisProc struct {
	bin     string
	dir     string
	logPath string
	port    int
	// busPort is the cluster bus port; zero for a non-cluster server.
	busPort int
	// extra holds arguments after the common ones (persistence, cluster).
	extra []string
	// tls, when set, adds a TLS port next to the plain one (which the
	// harness keeps for its own PING and commands).
	tls     *RedisTLS
	tlsPort int

	mu  sync.Mutex
	cur *redisChild // nil when not running
}

// redisChild is one run of the process. Its waiter goroutine is owned by the
// child: it ends when the process exits, which stop and kill guarantee.
type redisChild struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // cmd.Wait result, readable once exited is closed
}

func (p *redisProc) addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

func (p *redisProc) args() []string {
	args := []string{
		"--port", strconv.Itoa(p.port),
		"--bind", "127.0.0.1",
		"--dir", p.dir,
		"--daemonize", "no",
		"--maxmemory-policy", "noeviction",
	}
	if p.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(p.busPort))
	}
	if p.tls != nil {
		args = append(args, "--tls-port", strconv.Itoa(p.tlsPort),
			"--tls-cert-file", p.tls.CertFile, "--tls-key-file", p.tls.KeyFile,
			"--tls-ca-cert-file", p.tls.CAFile, "--tls-auth-clients", "yes")
	}
	return append(args, p.extra...)
}

// start runs redis-server and waits until it answers PING and reports its own
// process id (so a stranger on the port is not mistaken for it). On failure the
// process is killed and the error carries the tail of its log; errBindConflict
// is wrapped in when the port was taken.
func (p *redisProc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil {
		return fmt.Errorf("redis-server on %s is already running", p.addr())
	}
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open redis log: %w", err)
	}
	logStart, _ := logFile.Seek(0, io.SeekEnd)

	cmd := exec.Command(p.bin, p.args()...)
	cmd.Dir = p.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	child := &redisChild{cmd: cmd, exited: make(chan struct{})}
	go func() {
		child.err = cmd.Wait()
		_ = logFile.Close()
		close(child.exited)
	}()

	var exitedEarly bool
	exited := func() bool {
		select {
		case <-child.exited:
			exitedEarly = true
			return true
		default:
			return false
		}
	}
	ready := waitFor(redisStartTimeout, func() bool {
		// The PID check matters: when another process holds the port (say
		// another test's redis-server), it answers PING while ours has
		// failed to bind.
		return exited() || (pingRaw(p.addr()) == nil && serverPID(p.addr()) == cmd.Process.Pid) || exited()
	})
	if ready && !exitedEarly {
		p.cur = child
		return nil
	}
	if !exitedEarly {
		_ = cmd.Process.Kill()
	}
	<-child.exited
	tail := tailFile(p.logPath, logStart, logTailLines)
	var cause error
	switch {
	case strings.Contains(tail, "Address already in use"):
		cause = errBindConflict
	case exitedEarly:
		cause = fmt.Errorf("exited early: %v", child.err)
	default:
		cause = fmt.Errorf("no PONG within %s", redisStartTimeout)
	}
	return fmt.Errorf("redis-server on %s (%s): %w\n--- log tail (%s) ---\n%s",
		p.addr(), strings.Join(cmd.Args, " "), cause, p.logPath, tail)
}

func (p *redisProc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur != nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *redisProc) kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return fmt.Errorf("redis-server on %s is not running", p.addr())
	}
	_ = p.cur.cmd.Process.Kill()
	<-p.cur.exited
	p.cur = nil
	return nil
}

// freeze stops (true) or continues (false) the running process.
func (p *redisProc) freeze(stop bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return fmt.Errorf("redis-server on %s is not running", p.addr())
	}
	return freeze(p.cur.cmd.Process, stop)
}

// shutdown asks the server to exit with SHUTDOWN (NOSAVE unless save) and waits
// for it; if it does not exit in time it is killed and an error returned.
func (p *redisProc) shutdown(save bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return fmt.Errorf("redis-server on %s is not running", p.addr())
	}
	cmd := []string{"SHUTDOWN", "NOSAVE"}
	if save {
		cmd = []string{"SHUTDOWN"}
	}
	// The server closes the connection instead of replying when it obeys, so
	// the reply error says nothing; the process exit is the answer.
	_, _ = commandRaw(p.addr(), cmd...)
	child := p.cur
	p.cur = nil
	select {
	case <-child.exited:
		return nil
	case <-time.After(redisStopTimeout):
		_ = child.cmd.Process.Kill()
		<-child.exited
		return fmt.Errorf("redis-server on %s ignored %s for %s; killed", p.addr(), strings.Join(cmd, " "), redisStopTimeout)
	}
}

// terminate stops the process for cleanup: SIGTERM, then SIGKILL after a bound.
// It is a no-op when the process is not running.
func (p *redisProc) terminate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return
	}
	child := p.cur
	p.cur = nil
	_ = freeze(child.cmd.Process, false) // a frozen server could not obey
	_ = child.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-child.exited:
	case <-time.After(redisStopTimeout):
		_ = child.cmd.Process.Kill()
		<-child.exited
	}
}

// pingRaw sends PING over a fresh connection and expects +PONG. It speaks RESP
// directly so waiting for a server needs no client pool and no retry policy.
func pingRaw(addr string) error {
	reply, err := commandRaw(addr, "PING")
	if err != nil {
		return err
	}
	if reply != "+PONG" {
		return fmt.Errorf("PING %s: unexpected reply %q", addr, reply)
	}
	return nil
}

// serverPID returns the process_id the server at addr reports, or 0.
func serverPID(addr string) int {
	info, err := commandRaw(addr, "INFO", "server")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				return 0
			}
			return pid
		}
	}
	return 0
}

// rawTimeout bounds one raw command; it is short because something that
// accepts a connection but never answers must not stall a start.
const rawTimeout = 500 * time.Millisecond

// commandRaw sends one command and returns its reply: the line of a simple
// or error reply, or the payload of a bulk string.
func commandRaw(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, rawTimeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(rawTimeout)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", fmt.Errorf("%s %s: write: %w", args[0], addr, err)
	}
	rd := bufio.NewReader(conn)
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("%s %s: read: %w", args[0], addr, err)
	}
	line = strings.TrimRight(line, "\r\n")
	size, isBulk := strings.CutPrefix(line, "$")
	if !isBulk {
		return line, nil
	}
	n, err := strconv.Atoi(size)
	if err != nil || n < 0 {
		return "", fmt.Errorf("%s %s: bad bulk reply %q", args[0], addr, line)
	}
	payload := make([]byte, n+2) // with the trailing CRLF
	if _, err := io.ReadFull(rd, payload); err != nil {
		return "", fmt.Errorf("%s %s: read: %w", args[0], addr, err)
	}
	return string(payload[:n]), nil
}

// lookupRedisServer finds redis-server on PATH.
func lookupRedisServer() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found on PATH: %w", err)
	}
	return bin, nil
}

// startRedisProc starts a redis-server on fresh loopback ports in dir, picking
// new ports when a picked one was taken in the meantime.
func startRedisProc(bin, dir string, cluster bool, tlsFiles *RedisTLS, extra []string) (*redisProc, error) {
	var lastErr error
	for range startAttempts {
		n := 1
		if cluster || tlsFiles != nil {
			n = 2
		}
		ports, err := freePorts(n)
		if err != nil {
			return nil, err
		}
		p := &redisProc{
			bin:     bin,
			dir:     dir,
			logPath: filepath.Join(dir, "redis.log"),
			port:    ports[0],
			extra:   extra,
		}
		switch {
		case cluster:
			p.busPort = ports[1]
		case tlsFiles != nil:
			p.tls, p.tlsPort = tlsFiles, ports[1]
		}
		err = p.start()
		if err == nil {
			return p, nil
		}
		lastErr = err
		if !errors.Is(err, errBindConflict) {
			return nil, err
		}
		// A cluster node may have written its config with the lost port.
		_ = os.Remove(filepath.Join(dir, clusterConfigFile))
	}
	return nil, fmt.Errorf("after %d attempts: %w", startAttempts, lastErr)
}
