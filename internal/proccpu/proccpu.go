// Package proccpu tells what CPU this process has used and what it may
// use: its user and system time, and the cores its cgroup's CPU bandwidth
// limit (cgroup v1 cpu.cfs_quota_us, v2 cpu.max) and GOMAXPROCS leave it.
// A replica's capacity is measured against them (scheduler), and the test
// harness reads the same cgroup files to make CPU groups (testenv).
package proccpu

import (
	"runtime"
	"time"
)

// Used is the user and system CPU time this process has used so far, and
// false where it cannot be read.
func Used() (time.Duration, bool) { return used() }

// Cores is how much CPU this process may use, in cores: the least of
// GOMAXPROCS and the bandwidth limit of its cgroup and every group above
// it (0.1: 10 ms in every 100 ms).
func Cores() float64 {
	n := float64(runtime.GOMAXPROCS(0))
	if limit, ok := cgroupLimit(); ok {
		return min(n, limit)
	}
	return n
}
