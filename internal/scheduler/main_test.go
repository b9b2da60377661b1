package scheduler

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	// Most of these tests wait for ticks of the wall clock and for their
	// servers, little of it on the CPU.
	if err := testenv.DefaultParallel(4); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}
