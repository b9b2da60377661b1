package deploycheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// cronstreamBinary builds cmd/cronstream once for the tests that run it.
func cronstreamBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "deploycheck")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "cronstream")
		build := exec.Command("go", "build", "-o", binPath, "./cmd/cronstream")
		build.Dir = root(t)
		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/cronstream: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// cronstreamEnv is the test process's environment without any CRONSTREAM_*
// variable, plus extra.
func cronstreamEnv(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if len(kv) < len("CRONSTREAM_") || kv[:len("CRONSTREAM_")] != "CRONSTREAM_" {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}
