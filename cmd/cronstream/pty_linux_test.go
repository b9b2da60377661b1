package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY returns both ends of a new pseudo-terminal: what a command under
// test takes for a terminal (tty) and the side a test types into and
// reads from (ptm).
func openPTY(t *testing.T) (ptm, tty *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { ptm.Close() })
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return ptm, tty
}

// runOnTerminal runs the binary with stdin and stderr on a terminal,
// answers the first question it asks (a line ending in "[y/N] ") with
// answer, and returns what the terminal showed, stdout and the exit code.
func (e *cliEnv) runOnTerminal(answer string, args ...string) (shown, stdout string, code int) {
	e.t.Helper()
	ptm, tty := openPTY(e.t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = e.vars
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, &out, tty
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	asked := make(chan struct{})
	shownC := make(chan string, 1)
	go func() {
		// The only reader of the terminal: it owns what was seen until the
		// terminal closes.
		var seen strings.Builder
		defer func() { shownC <- seen.String() }()
		r := bufio.NewReader(ptm)
		once := false
		for {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			seen.WriteByte(b)
			if !once && strings.HasSuffix(seen.String(), "[y/N] ") {
				once = true
				close(asked)
			}
		}
	}()
	select {
	case <-asked:
		fmt.Fprintf(ptm, "%s\n", answer)
	case <-ctx.Done():
	}
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatal(err)
	}
	tty.Close() // the reader then sees the terminal end
	return <-shownC, out.String(), code
}

// TestBulkAsksOnATerminal: on a terminal several changes are shown and
// asked about; only "y" makes them.
func TestBulkAsksOnATerminal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	for _, id := range []string{"t1", "t2", "t3"} {
		e.ok("entry", "put", id, "--cron", "@hourly", "--type", "job", "--label", "team=ops")
	}
	shown, _, code := e.runOnTerminal("n", "entry", "pause", "--selector", "team=ops")
	if code == 0 || !strings.Contains(shown, "Pause 3 entries? [y/N]") || !strings.Contains(shown, "t2 (revision") {
		t.Errorf("declined: exit %d, terminal showed:\n%s", code, shown)
	}
	if out := e.ok("entry", "ls", "--state", "paused"); !strings.Contains(out, "no entries") {
		t.Errorf("a declined pause paused:\n%s", out)
	}
	_, out, code := e.runOnTerminal("y", "entry", "pause", "--selector", "team=ops")
	if code != 0 || !strings.Contains(out, "paused 3 entries") {
		t.Errorf("confirmed: exit %d, stdout %s", code, out)
	}
}

// runOnTerminalOut runs the binary with stdout on a terminal and returns
// what it printed there.
func (e *cliEnv) runOnTerminalOut(args ...string) string {
	e.t.Helper()
	ptm, tty := openPTY(e.t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = e.vars
	cmd.Stdout = tty
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	shown := make(chan string, 1)
	go func() {
		var b bytes.Buffer
		_, _ = b.ReadFrom(ptm) // until the terminal closes (EIO)
		shown <- b.String()
	}()
	if err := cmd.Wait(); err != nil {
		e.t.Fatalf("cronstream %s: %v", strings.Join(args, " "), err)
	}
	tty.Close()
	return <-shown
}

// TestEntryLsRelativeTimesOnATerminal: on a terminal each time is followed
// by how far it is from now.
func TestRelativeTimesOnATerminal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.ok("entry", "put", "soon", "--cron", "@hourly", "--type", "t")
	for _, c := range []struct {
		args []string
		want []string // each beside an absolute time
	}{
		{[]string{"entry", "ls"}, []string{"(in "}},
		{[]string{"entry", "get", "soon"}, []string{"s ago)", "(in "}},      // updated, next fire
		{[]string{"entry", "describe", "soon"}, []string{"s ago)", "(in "}}, // history, next fires
		{[]string{"entry", "history", "soon"}, []string{"s ago)"}},
	} {
		out := e.runOnTerminalOut(c.args...)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s on a terminal shows no relative time %q:\n%s", strings.Join(c.args, " "), w, out)
			}
		}
		// A pipe gets absolute times only, as scripts expect.
		if piped := e.ok(c.args...); strings.Contains(piped, " ago)") || strings.Contains(piped, "(in ") {
			t.Errorf("%s into a pipe shows relative times:\n%s", strings.Join(c.args, " "), piped)
		}
	}
}
