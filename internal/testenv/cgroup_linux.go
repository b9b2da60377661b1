//go:build linux

package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/proccpu"
)

// CPUGroup is a cgroup that limits the processes started in it to a share
// of one core (CFS bandwidth control): cgroup v1's cpu.cfs_quota_us and
// cpu.cfs_period_us, or cgroup v2's cpu.max. It is made below this
// process's own cgroup of the hierarchy that holds the cpu controller and
// removed at the test's cleanup, after the processes in it are gone.
type CPUGroup struct {
	dir string
	v2  bool
}

// cpuGroupEmptyTimeout bounds the wait at cleanup for the group's processes
// to be reaped (their own cleanups stop them first).
const cpuGroupEmptyTimeout = 10 * time.Second

// NewCPUGroup makes a CPU group named after name that gives its processes
// at most cores of a core (0.1: 10 ms in every 100 ms) and removes it at
// t's cleanup. An error wrapping ErrNoCPUGroup says why no group could be
// made here (a caller skips on it); any other error is a bad argument.
func NewCPUGroup(t testing.TB, name string, cores float64) (*CPUGroup, error) {
	t.Helper()
	quota, err := cpuQuota(cores)
	if err != nil {
		return nil, err
	}
	if err := validGroupName(name); err != nil {
		return nil, err
	}
	parent, v2, err := cpuHierarchy()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(parent, fmt.Sprintf("testenv-%d-%d-%s", os.Getpid(), cpuGroupSeq.Add(1), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCPUGroup, err)
	}
	g := &CPUGroup{dir: dir, v2: v2}
	t.Cleanup(func() {
		if err := g.remove(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	if err := g.setQuota(quota); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCPUGroup, err)
	}
	return g, nil
}

// Dir is the group's directory in the cgroup file system.
func (g *CPUGroup) Dir() string { return g.dir }

// Start starts cmd inside the group. Under cgroup v2 the process is born
// in it (CLONE_INTO_CGROUP); under v1 it is moved in right after the fork,
// so its first instructions (microseconds of the runtime's start) run
// outside the quota. When the move fails the process is killed and waited
// for, and the error returned.
func (g *CPUGroup) Start(cmd *exec.Cmd) error {
	if !g.v2 {
		if err := cmd.Start(); err != nil {
			return err
		}
		if err := g.add(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return err
		}
		return nil
	}
	f, err := os.Open(g.dir)
	if err != nil {
		return fmt.Errorf("testenv: open CPU group: %w", err)
	}
	defer f.Close()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(f.Fd())
	return cmd.Start()
}

// Stat reads the group's throttling so far.
func (g *CPUGroup) Stat() (CPUGroupStat, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "cpu.stat"))
	if err != nil {
		return CPUGroupStat{}, fmt.Errorf("testenv: CPU group stat: %w", err)
	}
	var st CPUGroupStat
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "nr_periods":
			st.Periods = n
		case "nr_throttled":
			st.ThrottledPeriods = n
		case "throttled_time": // v1, nanoseconds
			st.Throttled = time.Duration(n)
		case "throttled_usec": // v2
			st.Throttled = time.Duration(n) * time.Microsecond
		}
	}
	return st, nil
}

func (g *CPUGroup) setQuota(quota time.Duration) error {
	if g.v2 {
		return writeCgroupFile(g.dir, "cpu.max", fmt.Sprintf("%d %d", quota.Microseconds(), cpuGroupPeriod.Microseconds()))
	}
	// The period first: a quota is checked against the period in place.
	if err := writeCgroupFile(g.dir, "cpu.cfs_period_us", strconv.FormatInt(cpuGroupPeriod.Microseconds(), 10)); err != nil {
		return err
	}
	return writeCgroupFile(g.dir, "cpu.cfs_quota_us", strconv.FormatInt(quota.Microseconds(), 10))
}

func (g *CPUGroup) add(pid int) error {
	return writeCgroupFile(g.dir, "cgroup.procs", strconv.Itoa(pid))
}

// remove waits for the group to have no process left, then deletes it.
func (g *CPUGroup) remove() error {
	var procs string
	empty := waitFor(cpuGroupEmptyTimeout, func() bool {
		b, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
		procs = strings.TrimSpace(string(b))
		return err != nil || procs == ""
	})
	if !empty {
		return fmt.Errorf("CPU group %s still holds processes %s after %s; not removed", g.dir, strings.Fields(procs), cpuGroupEmptyTimeout)
	}
	if err := os.Remove(g.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove CPU group: %w", err)
	}
	return nil
}

func writeCgroupFile(dir, name, value string) error {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("write %q to %s: %w", value, filepath.Join(dir, name), err)
	}
	return nil
}

// cpuHierarchy finds where this process may make CPU groups (see
// pickCPUHierarchy). An error wraps ErrNoCPUGroup with the reason.
func cpuHierarchy() (dir string, v2 bool, err error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false, fmt.Errorf("%w: %v", ErrNoCPUGroup, err)
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, fmt.Errorf("%w: %v", ErrNoCPUGroup, err)
	}
	return pickCPUHierarchy(proccpu.ParseMountinfo(string(mountinfo)), proccpu.ParseProcCgroup(string(own)), delegateCPU)
}

// pickCPUHierarchy picks where to make CPU groups: this process's own group
// in the v1 hierarchy that has the cpu controller; else, under cgroup v2,
// its own group or else the hierarchy's top, the first below which delegate
// can make the cpu controller available (the kernel lets a group with
// processes of its own give controllers to groups below it only at the
// top).
func pickCPUHierarchy(mounts []proccpu.Mount, own map[string]string, delegate func(dir string) error) (dir string, v2 bool, err error) {
	for _, m := range mounts {
		if !m.V2 && slices.Contains(m.Options, "cpu") {
			return m.Join(own["cpu"]), false, nil
		}
	}
	var why []string
	for _, m := range mounts {
		if !m.V2 {
			continue
		}
		for _, dir := range slices.Compact([]string{m.Join(own[""]), m.Point}) {
			err := delegate(dir)
			if err == nil {
				return dir, true, nil
			}
			why = append(why, err.Error())
		}
	}
	if len(why) == 0 {
		return "", false, fmt.Errorf("%w: no cgroup hierarchy with the cpu controller is mounted", ErrNoCPUGroup)
	}
	return "", false, fmt.Errorf("%w: %s", ErrNoCPUGroup, strings.Join(why, "; "))
}

// delegateCPU makes sure the cgroup v2 groups below dir can use the cpu
// controller. The kernel refuses that in a non-root group that holds
// processes (the "no internal processes" rule); the error says so.
func delegateCPU(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2 at %s: %w", dir, err)
	}
	if !slices.Contains(strings.Fields(string(b)), "cpu") {
		return fmt.Errorf("cgroup v2 at %s: the cpu controller is not available there (controllers: %q)", dir, strings.TrimSpace(string(b)))
	}
	b, err = os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
		return nil
	}
	if err := writeCgroupFile(dir, "cgroup.subtree_control", "+cpu"); err != nil {
		return fmt.Errorf("cgroup v2: cannot give the cpu controller to the groups below %s: %w", dir, err)
	}
	return nil
}
