package testenv

import (
	"time"

	"github.com/cronstream/cronstream/internal/proccpu"
)

// SelfCPU is the user+system CPU time of the test process itself: the
// embedded servers, the code under test and the test's own readers (0
// where it cannot be read).
func SelfCPU() time.Duration {
	d, _ := proccpu.Used()
	return d
}
