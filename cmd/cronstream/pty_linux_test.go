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
	return e.runOnTerminalAsked(nil, answer, args...)
}

// runOnTerminalAsked is runOnTerminal calling whenAsked (when not nil)
// once the question is shown and before it is answered: what happens
// while an operator reads the preview.
func (e *cliEnv) runOnTerminalAsked(whenAsked func(), answer string, args ...string) (shown, stdout string, code int) {
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
		if whenAsked != nil {
			whenAsked()
		}
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

// TestBulkAsksOnATerminal: on a terminal every command that changes
// several things (bulk pause, sync --prune, backfill) shows what it will do
// and asks; "n" changes nothing, only "y" makes the changes, each
// conditional on what was shown.
func TestBulkAsksOnATerminal(t *testing.T) {
	t.Parallel()
	env := newEnv(t, true) // one deployment for every case; backfill needs Redis
	sub := func(t *testing.T) *cliEnv { e := *env; e.t = t; return &e }
	t.Run("pause", func(t *testing.T) {
		e := sub(t)
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
	})
	t.Run("entry changed while asked", func(t *testing.T) {
		e := sub(t)
		// t2 changes between the preview and the "y": the bulk write,
		// conditional on the revision shown, leaves it alone (exit 4).
		changed := func() { e.ok("entry", "put", "t2", "--cron", "@daily") }
		_, out, code := e.runOnTerminalAsked(changed, "y", "entry", "resume", "--selector", "team=ops")
		if code != exitConflict || !strings.Contains(out, "resumed 2 entries, 1 conflicted") {
			t.Errorf("resume with t2 changed meanwhile: exit %d, want %d; stdout %s", code, exitConflict, out)
		}
		var got entryJSON
		e.okJSON(&got, "entry", "get", "t2", "--json")
		if !got.Paused || got.Cron != "@daily" {
			t.Errorf("t2 after the conflicted resume: paused %v, cron %q (want the change kept and t2 still paused)", got.Paused, got.Cron)
		}
	})
	t.Run("sync --prune", func(t *testing.T) {
		e := sub(t)
		e.ok("sync", "-f", writeFile(t, "three.yaml", "entries:\n"+
			"  - {id: p1, cron: '@daily', task: {type: t}}\n"+
			"  - {id: p2, cron: '@daily', task: {type: t}}\n"+
			"  - {id: p3, cron: '@daily', task: {type: t}}\n"))
		none := writeFile(t, "none.yaml", "entries: []\n")
		shown, _, code := e.runOnTerminal("n", "sync", "-f", none, "--prune")
		if code == 0 || !strings.Contains(shown, "- p2") || !strings.Contains(shown, "3 to remove") || !strings.Contains(shown, "Apply 3 changes? [y/N]") {
			t.Errorf("declined: exit %d, terminal showed:\n%s", code, shown)
		}
		e.ok("entry", "get", "p2") // still there
		_, out, code := e.runOnTerminal("y", "sync", "-f", none, "--prune")
		if code != 0 || !strings.Contains(out, "p2 removed at revision") {
			t.Errorf("confirmed: exit %d, stdout %s", code, out)
		}
		if r := e.run("entry", "get", "p2"); r.code != exitNotFound {
			t.Errorf("p2 after a confirmed prune:\n%s", r)
		}
	})
	t.Run("backfill", func(t *testing.T) {
		e := sub(t)
		ins := inspector(t, e.redis.URL)
		e.ok("entry", "put", "bf", "--cron", "*/10 * * * *", "--type", "t", "--queue", "backfill")
		from := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
		args := []string{"entry", "backfill", "bf", "--from", from.Format(time.RFC3339), "--to", from.Add(30 * time.Minute).Format(time.RFC3339), "--before-registration"}
		shown, _, code := e.runOnTerminal("n", args...)
		if code == 0 || !strings.Contains(shown, "4 to fire:") || !strings.Contains(shown, "Fire 4 ticks? [y/N]") {
			t.Errorf("declined: exit %d, terminal showed:\n%s", code, shown)
		}
		if n := len(pendingTasks(t, ins, "backfill")); n != 0 {
			t.Errorf("a declined backfill enqueued %d tasks", n)
		}
		_, out, code := e.runOnTerminal("y", args...)
		if code != 0 || !strings.Contains(out, "4 fired now") {
			t.Errorf("confirmed: exit %d, stdout %s", code, out)
		}
		if n := len(pendingTasks(t, ins, "backfill")); n != 4 {
			t.Errorf("a confirmed backfill of 4 ticks enqueued %d tasks", n)
		}
	})
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
	e := newEnv(t, true)
	e.ok("entry", "put", "soon", "--cron", "@hourly", "--type", "t")
	for _, c := range []struct {
		args []string
		want []string // each beside an absolute time
		// status always said how far its next fires are ("in 59s").
		pipeHasRelative bool
	}{
		{[]string{"entry", "ls"}, []string{"(in "}, false},
		{[]string{"entry", "get", "soon"}, []string{"s ago)", "(in "}, false},      // updated, next fire
		{[]string{"entry", "describe", "soon"}, []string{"s ago)", "(in "}, false}, // history, next fires
		{[]string{"entry", "history", "soon"}, []string{"s ago)"}, false},
		{[]string{"audit"}, []string{"s ago)"}, false},
		{[]string{"status"}, []string{"s ago)"}, true}, // the stream's last message
	} {
		out := e.runOnTerminalOut(c.args...)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s on a terminal shows no relative time %q:\n%s", strings.Join(c.args, " "), w, out)
			}
		}
		// A pipe gets absolute times only, as scripts expect.
		if piped := e.ok(c.args...); !c.pipeHasRelative && (strings.Contains(piped, " ago)") || strings.Contains(piped, "(in ")) {
			t.Errorf("%s into a pipe shows relative times:\n%s", strings.Join(c.args, " "), piped)
		}
	}
}
