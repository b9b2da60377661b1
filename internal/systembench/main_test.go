package systembench

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain removes the binary a benchmark built and checks for leaked
// goroutines. It starts nothing itself: the benchmarks build the binary and
// start the servers, so a plain `go test` of this package costs nothing.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
