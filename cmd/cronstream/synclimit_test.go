package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// maxRSS runs the binary with stdin and returns its exit status, stderr
// and the peak resident memory of its process in bytes.
func (e *cliEnv) maxRSS(stdin []byte, args ...string) (int, string, int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = e.vars
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		e.t.Fatalf("cronstream %s: %v", strings.Join(args, " "), err)
	}
	ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if ru == nil {
		e.t.Fatal("no resource usage for the process")
	}
	return cmd.ProcessState.ExitCode(), stderr.String(), ru.Maxrss << 10 // KiB on Linux
}

// TestSyncFileSizeLimit: `sync -f` refuses a schedules file over
// --max-file-size (default 4MiB) with exit status 64 before reading it, so
// an 8 GiB file costs no more memory than a tiny one; standard
// input is refused once past the limit; within the limit a file is read.
func TestSyncFileSizeLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Two-byte values: the shape that costs the YAML parser most per byte.
	huge := append([]byte("entries: ["), bytes.Repeat([]byte("1,"), 25<<20)...)
	tiny := write("tiny.yaml", []byte("entries: [1]\n"))
	// An 8 GiB file, sparse so it takes no disk: read, it would cost
	// gigabytes and seconds; refused by its size, nothing.
	hugePath := filepath.Join(dir, "huge.yaml")
	if f, err := os.Create(hugePath); err != nil {
		t.Fatal(err)
	} else if err := errors.Join(f.Truncate(8<<30), f.Close()); err != nil {
		t.Fatal(err)
	}

	_, _, base := e.maxRSS(nil, "sync", "-f", tiny, "--dry-run")
	code, msg, rss := e.maxRSS(nil, "sync", "-f", hugePath)
	if code != exitUsage || !strings.Contains(msg, "limit of 4194304") || !strings.Contains(msg, "--max-file-size") {
		t.Fatalf("sync of an 8 GiB file: exit %d, want %d naming the limit:\n%s", code, exitUsage, msg)
	}
	t.Logf("peak RSS: %d MB for a tiny file, %d MB refusing an 8 GiB one", base>>20, rss>>20)
	// The race detector moves a process's peak by tens of MB from run to
	// run; reading the file would cost gigabytes.
	if rss > base+256<<20 {
		t.Errorf("refusing the 8 GiB file took %d MB more than a tiny file: it was read", (rss-base)>>20)
	}

	// Standard input: refused once it passed the limit.
	code, msg, _ = e.maxRSS(huge[:5<<20], "sync", "-f", "-")
	if code != exitUsage || !strings.Contains(msg, "stdin holds more than the limit") {
		t.Fatalf("sync -f - of 5 MB: exit %d:\n%s", code, msg)
	}

	// The flag: smaller and larger limits, and nonsense.
	ok := write("ok.yaml", []byte("entries:\n  - {id: a, cron: '@daily', task: {type: t}}\n"))
	if code, msg, _ := e.maxRSS(nil, "sync", "-f", ok, "--max-file-size", "16"); code != exitUsage || !strings.Contains(msg, "limit of 16") {
		t.Errorf("--max-file-size 16: exit %d:\n%s", code, msg)
	}
	if out := e.ok("sync", "-f", ok, "--max-file-size", "1KiB"); !strings.Contains(out, "1 to create") {
		t.Errorf("within the limit: %s", out)
	}
	for _, v := range []string{"0", "-1", "lots"} {
		if r := e.run("sync", "-f", ok, "--max-file-size", v); r.code != exitUsage {
			t.Errorf("--max-file-size %s: %s", v, r)
		}
	}
	// A file over the default within a raised limit is read (and this one
	// refused whole for what it holds).
	long := write("long.yaml", append([]byte("entries: 1\n# "), bytes.Repeat([]byte("x"), 5<<20)...))
	if r := e.run("sync", "-f", long, "--dry-run"); r.code != exitUsage {
		t.Errorf("5 MB under the default limit: %s", r)
	}
	if r := e.run("sync", "-f", long, "--max-file-size", "8MiB", "--dry-run"); r.code != exitUsage || !strings.Contains(r.stderr, `"entries" must be a list`) {
		t.Errorf("malformed file within a raised limit: %s", r)
	}
}
