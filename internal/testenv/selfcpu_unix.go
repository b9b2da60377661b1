//go:build unix

package testenv

import (
	"syscall"
	"time"
)

// SelfCPU is the user+system CPU time of the test process itself: the
// embedded servers, the code under test and the test's own readers.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
