package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// binaries are the cronstream and worker executables, built once per test
// binary run (both tests use them) and removed in TestMain.
var binaries struct {
	once       sync.Once
	dir        string
	cronstream string
	worker     string
	err        error
}

// buildBinaries builds ./cmd/cronstream and ./chaos/testdata/worker from
// this tree into a temporary directory.
func buildBinaries(t *testing.T) (cronstream, worker string) {
	t.Helper()
	binaries.once.Do(func() {
		dir, err := os.MkdirTemp("", "cronstream-chaos-bin-")
		if err != nil {
			binaries.err = fmt.Errorf("temp dir for binaries: %w", err)
			return
		}
		binaries.dir = dir
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		start := time.Now()
		// Both in one invocation: the packages they share compile once.
		cmd := exec.Command(goTool, "build", "-o", dir+string(os.PathSeparator), "../cmd/cronstream", "./testdata/worker")
		out, err := cmd.CombinedOutput()
		if err != nil {
			binaries.err = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		binaries.cronstream = filepath.Join(dir, "cronstream")
		binaries.worker = filepath.Join(dir, "worker")
		t.Logf("built cronstream and worker in %s", time.Since(start).Round(100*time.Millisecond))
	})
	if binaries.err != nil {
		t.Fatalf("build binaries: %v", binaries.err)
	}
	return binaries.cronstream, binaries.worker
}

func removeBinaries() {
	if binaries.dir != "" {
		_ = os.RemoveAll(binaries.dir)
	}
}

// childEnv is the test's environment without CRONSTREAM_* and REDIS_URL, so
// a developer's settings cannot change what a child process connects to.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CRONSTREAM_") || strings.HasPrefix(kv, "REDIS_URL=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// proc is one child process that the test starts, kills and restarts many
// times: same binary, arguments and log file (appended across runs).
type proc struct {
	name    string
	bin     string
	args    []string
	logPath string

	mu  sync.Mutex
	cur *run // nil when not running
	gen int  // how many times it was started
	// unexpected lists exits the test did not cause (crashes, errors).
	unexpected []string
}

// run is one start of a proc. Its waiter goroutine belongs to it and ends
// when the process exits, which kill and stop guarantee.
type run struct {
	cmd    *exec.Cmd
	gen    int
	killed bool // the test signalled it; its exit is expected
	exited chan struct{}
	err    error
}

func newProc(name, bin, logPath string, args ...string) *proc {
	return &proc{name: name, bin: bin, args: args, logPath: logPath}
}

// start runs the process with output appended to its log file.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil {
		return fmt.Errorf("%s is already running", p.name)
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s log: %w", p.name, err)
	}
	p.gen++
	fmt.Fprintf(f, "=== chaos: start #%d of %s at %s\n", p.gen, p.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = f, f
	testenv.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	r := &run{cmd: cmd, gen: p.gen, exited: make(chan struct{})}
	p.cur = r
	go func() {
		r.err = cmd.Wait()
		_ = f.Close()
		p.mu.Lock()
		if !r.killed {
			p.unexpected = append(p.unexpected, fmt.Sprintf("%s run #%d exited by itself at %s: %v", p.name, r.gen, time.Now().Format("15:04:05.000"), r.err))
		}
		if p.cur == r {
			p.cur = nil
		}
		p.mu.Unlock()
		close(r.exited)
	}()
	return nil
}

// generation returns the current run's number and whether it is running.
func (p *proc) generation() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return p.gen, false
	}
	return p.cur.gen, true
}

func (p *proc) running() bool {
	_, ok := p.generation()
	return ok
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	return p.cur.cmd.Process.Pid
}

// signal sends sig to the running process and waits up to wait for it to
// exit, then SIGKILLs it. It reports false when nothing was running.
func (p *proc) signal(sig syscall.Signal, wait time.Duration) bool {
	p.mu.Lock()
	r := p.cur
	if r != nil {
		r.killed = true
	}
	p.mu.Unlock()
	if r == nil {
		return false
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.exited:
	case <-time.After(wait):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
	return true
}

// kill is kill -9 and a wait for the exit.
func (p *proc) kill() bool { return p.signal(syscall.SIGKILL, time.Minute) }

// signalWait stops the process cleanly (SIGTERM), killing it after wait.
func (p *proc) signalWait(wait time.Duration) bool { return p.signal(syscall.SIGTERM, wait) }

func (p *proc) unexpectedExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unexpected...)
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.logPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logDir is where process logs go: CRONSTREAM_CHAOS_LOGDIR when set (kept
// after the test, for replaying a failure), else t.TempDir().
func logDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("CRONSTREAM_CHAOS_LOGDIR"); d != "" {
		dir := filepath.Join(d, t.Name()+"-"+time.Now().Format("20060102-150405"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("log dir: %v", err)
		}
		return dir
	}
	return t.TempDir()
}
