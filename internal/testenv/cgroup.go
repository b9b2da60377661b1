package testenv

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
)

// ErrNoCPUGroup means this process cannot make a cgroup that limits CPU:
// not Linux, not root, no cpu controller mounted, or (cgroup v2) the
// controller not available to the groups below this process's own. The
// error that wraps it says which.
var ErrNoCPUGroup = errors.New("testenv: no writable cgroup cpu controller")

// cpuGroupPeriod is the scheduler period a CPU group's quota is given per:
// the kernel's default, short enough that a process limited to a tenth of a
// core runs in 10 ms slices rather than waiting a second for its share.
const cpuGroupPeriod = 100 * time.Millisecond

// minCPUQuota is the least quota the kernel accepts per period (1 ms).
const minCPUQuota = time.Millisecond

// CPUGroupStat is a CPU group's throttling so far: the periods in which
// its processes wanted to run, those in which they used up the quota and
// were stopped, and for how long in all.
type CPUGroupStat struct {
	Periods          int64
	ThrottledPeriods int64
	Throttled        time.Duration
}

// cpuGroupSeq makes the names of the groups one test process creates
// distinct, also when a benchmark creates a group of the same name for each
// of several deployments.
var cpuGroupSeq atomic.Int64

// cpuQuota is the quota per cpuGroupPeriod for a share of cores, or an error
// for a share no machine could give.
func cpuQuota(cores float64) (time.Duration, error) {
	if !(cores > 0) || cores > float64(runtime.NumCPU()) {
		return 0, fmt.Errorf("testenv: a CPU group's share must be above 0 and at most the machine's %d cores, not %v", runtime.NumCPU(), cores)
	}
	return max(time.Duration(cores*float64(cpuGroupPeriod)), minCPUQuota), nil
}

// validGroupName reports whether name can be the last part of a group's
// directory name.
func validGroupName(name string) error {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return fmt.Errorf("testenv: %q cannot name a CPU group", name)
	}
	return nil
}
