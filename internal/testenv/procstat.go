package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ).
const userHZ = 100

// ProcCPU is the user+system CPU time of process pid, read from /proc: a
// server's CPU for a benchmark that runs it as a process of its own. It
// is 0 once the process is gone, and where there is no /proc.
func ProcCPU(pid int) time.Duration {
	f := procStat(pid)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / userHZ
}

// ProcFaults is the number of minor page faults of process pid (0 once it
// is gone): each is a page of memory the process touched for the first
// time, which a virtual machine makes costly.
func ProcFaults(pid int) int64 {
	f := procStat(pid)
	if len(f) < 8 {
		return 0
	}
	n, _ := strconv.ParseInt(f[7], 10, 64)
	return n
}

// Preemptions is how many times the kernel took the CPU from process pid
// while it could still run (nonvoluntary_ctxt_switches): for a server,
// each one lengthens the call it was running by the time it waited.
func Preemptions(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// procStat is the fields of /proc/<pid>/stat after the command name (which
// may hold spaces), nil once the process is gone.
func procStat(pid int) []string {
	if pid <= 0 {
		return nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
}

// MachineCPU is the machine's CPU time summed over its CPUs, from the
// first line of /proc/stat: busy (user, nice, system, irq, softirq; guest
// time is inside user) and steal (time the hypervisor ran something else
// while this machine had work). Zero where there is no /proc. A benchmark
// reads it at both ends of a window: a machine whose cores were all busy,
// or stolen, measured itself, not the processes it was running.
func MachineCPU() (busy, steal time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	ticks := func(i int) time.Duration {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		return time.Duration(n) * time.Second / userHZ
	}
	// user nice system idle iowait irq softirq steal
	return ticks(1) + ticks(2) + ticks(3) + ticks(6) + ticks(7), ticks(8)
}
