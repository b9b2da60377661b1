package scheduler

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	// Most of these tests wait for ticks, leases and servers; run eight at
	// a time, not GOMAXPROCS.
	if err := testenv.DefaultParallel(8); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}
