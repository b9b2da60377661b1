package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/testenv"
)

// bin is the cronstream binary under test, built once by TestMain with
// the race detector when the tests run with it: the long-running commands
// (run, dev, follows: start) run it. cliBin is the same build without the
// race detector, for the commands a test runs to completion (run, ok,
// fail): they are a thousand short, mostly sequential processes whose
// race-instrumented start alone costs three times their work, while the
// packages they call are race-tested in their own tests. A test whose
// short commands run goroutines of their own (bulk writes) sets
// cliEnv.raceCLI to run them with bin.
var bin, cliBin string

func TestMain(m *testing.M) {
	// These tests wait for ticks, servers and the replicas they start as
	// processes, little of it on the CPU.
	if err := testenv.DefaultParallel(4); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "cronstream-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, cliBin = filepath.Join(dir, "cronstream"), filepath.Join(dir, "cronstream-cli")
	builds := [][]string{{"build", "-o", bin, "."}}
	if raceEnabled {
		// The commands run as their own processes: build them with the
		// race detector too, so run and dev are checked as well.
		builds = [][]string{{"build", "-race", "-o", bin, "."}, {"build", "-o", cliBin, "."}}
	} else {
		cliBin = bin
	}
	for _, args := range builds {
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go %s: %v\n%s", strings.Join(args, " "), err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(testenv.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// cliEnv is one test's servers and the environment its commands run in.
type cliEnv struct {
	t     *testing.T
	nats  *testenv.NATS
	redis *testenv.Redis
	vars  []string
	// raceCLI runs the commands run to completion with the race-enabled
	// bin instead of cliBin.
	raceCLI bool
}

// newEnv starts NATS (and Redis when withRedis) for one test and points
// CRONSTREAM_NATS / CRONSTREAM_REDIS at them, as a user would.
func newEnv(t *testing.T, withRedis bool) *cliEnv {
	t.Helper()
	e := &cliEnv{t: t, nats: testenv.StartNATS(t)}
	e.vars = append(baseEnv(), "CRONSTREAM_NATS="+e.nats.URL())
	if withRedis {
		e.redis = testenv.StartRedis(t)
		e.vars = append(e.vars, "CRONSTREAM_REDIS="+e.redis.URL)
	} else {
		// Nothing listens there: a command that needs Redis fails fast.
		e.vars = append(e.vars, "CRONSTREAM_REDIS=redis://127.0.0.1:1")
	}
	return e
}

// baseEnv is the test process's environment without any CRONSTREAM_*
// variable, so nothing of the developer's shell leaks into a command.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CRONSTREAM_") && !strings.HasPrefix(kv, "GORACE=") {
			out = append(out, kv)
		}
	}
	// A race-enabled binary sleeps a second at exit by default (to let
	// racing goroutines report); a data race still fails the command
	// (exit 66).
	return append(out, "GORACE=atexit_sleep_ms=10")
}

// result is what one command did.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("cronstream %s\nexit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// run runs the binary to completion with stdin.
func (e *cliEnv) runIn(stdin string, args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	path := cliBin
	if e.raceCLI {
		path = bin
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = e.vars
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{args: args, stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		e.t.Fatalf("cronstream %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func (e *cliEnv) run(args ...string) result { e.t.Helper(); return e.runIn("", args...) }

// ok runs a command that must succeed and returns its stdout.
func (e *cliEnv) ok(args ...string) string {
	e.t.Helper()
	r := e.run(args...)
	if r.code != 0 {
		e.t.Fatalf("command failed:\n%s", r)
	}
	return r.stdout
}

// fail runs a command that must fail with a message on stderr, and
// returns the message.
func (e *cliEnv) fail(args ...string) string {
	e.t.Helper()
	r := e.run(args...)
	if r.code == 0 {
		e.t.Fatalf("command succeeded, want a failure:\n%s", r)
	}
	if strings.TrimSpace(r.stderr) == "" {
		e.t.Fatalf("command failed without a message on stderr:\n%s", r)
	}
	return r.stderr
}

// okJSON runs a command that must succeed and decodes its stdout into v.
func (e *cliEnv) okJSON(v any, args ...string) {
	e.t.Helper()
	out := e.ok(args...)
	reflect.ValueOf(v).Elem().SetZero() // decode into a fresh value, not over the last one
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("cronstream %s: stdout is not one JSON value (%v):\n%s", strings.Join(args, " "), err, out)
	}
}

// proc is a long-running command (run, dev, audit --follow, sync --watch)
// whose output lines the test reads as they come.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout chan string
	mu     sync.Mutex
	stderr bytes.Buffer // everything written to stderr so far
	outAll bytes.Buffer
	done   chan struct{}
	err    error
	readWG sync.WaitGroup
}

// start starts a long-running command in env; it is killed at cleanup if
// the test did not stop it.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startBin(t, bin, env, args...)
}

// startBin is start with another binary (a build of an earlier release).
func startBin(t *testing.T, path string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(path, args...), stdout: make(chan string, 1000), done: make(chan struct{})}
	p.cmd.Env = env
	outPipe, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errPipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.readWG.Add(2)
	go func() {
		defer p.readWG.Done()
		defer close(p.stdout)
		sc := bufio.NewScanner(outPipe)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.outAll.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.stdout <- sc.Text():
			default: // nobody reads lines: outAll keeps them
			}
		}
	}()
	go func() {
		defer p.readWG.Done()
		buf := make([]byte, 4096)
		for {
			n, err := errPipe.Read(buf)
			p.mu.Lock()
			p.stderr.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() {
		p.readWG.Wait()
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Stderr returns what the process wrote to stderr so far.
func (p *proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// Stdout returns every stdout line so far.
func (p *proc) Stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outAll.String()
}

// line waits for the next stdout line that contains want.
func (p *proc) line(want string, timeout time.Duration) string {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.stdout:
			if !ok {
				p.t.Fatalf("process exited before printing %q\nstderr:\n%s", want, p.Stderr())
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-deadline:
			p.t.Fatalf("no line with %q within %s\nstdout:\n%s\nstderr:\n%s", want, timeout, p.Stdout(), p.Stderr())
		}
	}
}

// stop sends sig and waits for the process to exit within timeout; it
// returns the exit code.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) int {
	p.t.Helper()
	// A process that has exited on its own (between the caller's last look
	// and the signal) is waited for like one the signal stopped; its exit
	// code tells the caller which it was.
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Fatalf("signal: %v", err)
	}
	return p.wait(timeout)
}

// wait waits for the process to exit within timeout and returns its exit
// code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("process did not exit within %s\nstderr:\n%s", timeout, p.Stderr())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		p.t.Fatalf("wait: %v", p.err)
	}
	return 0
}

// inspector returns an asynq Inspector on a Redis URL, closed at cleanup.
func inspector(t *testing.T, redisURL string) *asynq.Inspector {
	t.Helper()
	opt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		t.Fatalf("ParseRedisURI(%s): %v", redisURL, err)
	}
	ins := asynq.NewInspector(opt)
	t.Cleanup(func() { _ = ins.Close() })
	return ins
}

// pendingTasks lists queue's pending tasks, none when the queue is unknown.
func pendingTasks(t *testing.T, ins *asynq.Inspector, queue string) []*asynq.TaskInfo {
	t.Helper()
	tasks, err := ins.ListPendingTasks(queue, asynq.PageSize(1000))
	if err != nil && !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "not found") {
		t.Fatalf("ListPendingTasks(%s): %v", queue, err)
	}
	return tasks
}

// writeFile writes a file in the test's temp dir and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
