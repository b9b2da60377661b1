package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsServerPackage is the main package of the nats-server module this
// module already requires: the server a deployment runs, at the version
// the embedded servers run.
const natsServerPackage = "github.com/nats-io/nats-server/v2"

// natsStopTimeout bounds a graceful stop of a nats-server process before
// SIGKILL.
const natsStopTimeout = 10 * time.Second

// BuildNATSServer builds the nats-server binary from the module's own
// dependency (no download: the module cache already holds it) into dir and
// returns its path.
func BuildNATSServer(dir string) (string, error) {
	path := filepath.Join(dir, "nats-server")
	out, err := exec.Command("go", "build", "-o", path, natsServerPackage).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("testenv: go build %s: %w\n%s", natsServerPackage, err, out)
	}
	return path, nil
}

// NATSProcess is a nats-server process with JetStream, listening on
// 127.0.0.1 with its store in the test's temporary directory. Unlike an
// embedded NATS it runs apart from the test process, so what it costs is
// its own (its CPU in /proc/<PID>), as in a deployment.
type NATSProcess struct {
	port    int
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	err     error // cmd.Wait's, once exited is closed
}

// StartNATSProcess starts bin (a nats-server binary, BuildNATSServer's)
// with JetStream on a free port, waits until JetStream answers, and stops it
// at t's cleanup.
func StartNATSProcess(t testing.TB, bin string) *NATSProcess {
	t.Helper()
	dir := t.TempDir()
	var err error
	for range startAttempts {
		var ports []int
		if ports, err = freePorts(1); err != nil {
			break
		}
		var p *NATSProcess
		p, err = startNATSProcess(bin, dir, ports[0])
		if err == nil {
			t.Cleanup(func() {
				if err := p.Stop(); err != nil {
					t.Errorf("testenv: %v", err)
				}
				if t.Failed() {
					t.Logf("testenv: nats-server process log tail:\n%s", tailFile(p.logPath, 0, logTailLines))
				}
			})
			return p
		}
		if !errors.Is(err, errBindConflict) {
			break
		}
	}
	t.Fatalf("testenv: start nats-server process: %v", err)
	return nil
}

func startNATSProcess(bin, dir string, port int) (*NATSProcess, error) {
	p := &NATSProcess{port: port, logPath: filepath.Join(dir, "nats.log"), exited: make(chan struct{})}
	logStart := int64(0)
	if fi, err := os.Stat(p.logPath); err == nil {
		logStart = fi.Size()
	}
	p.cmd = exec.Command(bin, "--name", "testenv", "-a", "127.0.0.1", "-p", strconv.Itoa(port),
		"-js", "-sd", filepath.Join(dir, "store"), "-l", p.logPath)
	DieWithParent(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	ready := waitFor(natsHealthyTimeout, func() bool { return p.hasExited() || p.jetStreamAnswers() })
	if ready && !p.hasExited() {
		return p, nil
	}
	_ = p.Stop()
	tail := tailFile(p.logPath, logStart, logTailLines)
	cause := fmt.Errorf("JetStream not answering within %s", natsHealthyTimeout)
	if p.hasExited() {
		cause = fmt.Errorf("exited at start: %v", p.err)
	}
	if strings.Contains(strings.ToLower(tail), "address already in use") {
		cause = errBindConflict
	}
	return nil, fmt.Errorf("nats-server on port %d: %w\n--- log tail (%s) ---\n%s", port, cause, p.logPath, tail)
}

// jetStreamAnswers reports whether a client can connect and read its
// JetStream account.
func (p *NATSProcess) jetStreamAnswers() bool {
	nc, err := nats.Connect(p.URL(), nats.Timeout(natsReadyPoll), nats.NoReconnect())
	if err != nil {
		return false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err == nil
}

func (p *NATSProcess) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// URL is the client URL.
func (p *NATSProcess) URL() string {
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

// PID is the server's process id.
func (p *NATSProcess) PID() int { return p.cmd.Process.Pid }

// Connect opens a client connection, closed at t's cleanup, with the
// options of NATS.Connect.
func (p *NATSProcess) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, p.URL(), opts)
}

// JetStream returns a JetStream handle on a new connection, closed at t's
// cleanup.
func (p *NATSProcess) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return newJetStream(t, p.Connect(t))
}

// Stop stops the server with SIGTERM (SIGKILL after natsStopTimeout) and
// waits for it; it does nothing once the server has exited.
func (p *NATSProcess) Stop() error {
	if p.hasExited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(natsStopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("nats-server (pid %d) did not stop within %s of SIGTERM; killed", p.PID(), natsStopTimeout)
	}
}
