package testenv

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCPUGroupLimitsCPU runs a busy loop in a group of a tenth of a core
// and checks that it runs inside the group, is throttled, and gets no more
// CPU than the quota allows. It needs root (or a delegated cgroup v2) and
// skips with the reason elsewhere.
func TestCPUGroupLimitsCPU(t *testing.T) {
	const cores = 0.1
	g, err := NewCPUGroup(t, "busy", cores)
	if errors.Is(err, ErrNoCPUGroup) {
		t.Skipf("no CPU group can be made here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	DieWithParent(cmd)
	start := time.Now()
	if err := g.Start(cmd); err != nil {
		t.Fatal(err)
	}
	var stop sync.Once
	kill := func() {
		stop.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(kill)

	own, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(own), filepath.Base(g.Dir())) {
		t.Fatalf("the process's cgroups do not name %s:\n%s", g.Dir(), own)
	}
	var st CPUGroupStat
	Eventually(t, 30*time.Second, func() bool {
		st, err = g.Stat()
		return err == nil && st.ThrottledPeriods >= 5
	}, "the busy loop throttled in 5 periods (last: %s)", lazyString(func() string { return fmt.Sprintf("%+v, %v", st, err) }))
	kill()
	elapsed := time.Since(start)
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	// The quota per period, for every period begun, plus what the kernel
	// may hand out beyond it: runtime goes to each CPU in slices
	// (sched_cfs_bandwidth_slice_us, 5 ms by default) and the accounting
	// has a tick of its own. A group that limits nothing lets the loop use
	// the whole elapsed time, far above this.
	allowed := time.Duration(cores*float64(elapsed)) + time.Duration(cores*float64(cpuGroupPeriod)) + 50*time.Millisecond
	if used > allowed {
		t.Fatalf("the busy loop used %s of CPU in %s, over the %s a group of %v of a core allows", used, elapsed, allowed, cores)
	}
	if st.Throttled <= 0 {
		t.Fatalf("throttled in %d periods but for no time: %+v", st.ThrottledPeriods, st)
	}
}

func TestCPUGroupRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name  string
		group string
		cores float64
	}{
		{"no share", "g", 0},
		{"negative share", "g", -0.5},
		{"not a number", "g", math.NaN()},
		{"more cores than the machine", "g", 1e6},
		{"empty name", "", 0.1},
		{"name with a slash", "a/b", 0.1},
		{"parent directory", "..", 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewCPUGroup(t, tc.group, tc.cores)
			if err == nil || errors.Is(err, ErrNoCPUGroup) {
				t.Fatalf("NewCPUGroup(%q, %v) = %v, %v; want an argument error", tc.group, tc.cores, g, err)
			}
		})
	}
}
