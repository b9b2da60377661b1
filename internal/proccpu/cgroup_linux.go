//go:build linux

package proccpu

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Mount is one mounted cgroup hierarchy.
type Mount struct {
	Root, Point string   // the hierarchy's path mounted, and where
	Options     []string // v1: the controllers (and mount options)
	V2          bool
}

// Join is the directory of the hierarchy's group path (as /proc/self/cgroup
// names it).
func (m Mount) Join(path string) string {
	if m.Root != "/" {
		path = strings.TrimPrefix(path, m.Root)
	}
	return filepath.Join(m.Point, path)
}

// ParseMountinfo reads the cgroup hierarchies of /proc/self/mountinfo.
func ParseMountinfo(mountinfo string) []Mount {
	var out []Mount
	for _, line := range strings.Split(mountinfo, "\n") {
		// "<id> <parent> <dev> <root> <point> <options> [optional...] - <type> <source> <super options>"
		left, right, ok := strings.Cut(line, " - ")
		l, r := strings.Fields(left), strings.Fields(right)
		if !ok || len(l) < 5 || len(r) < 3 {
			continue
		}
		switch r[0] {
		case "cgroup":
			out = append(out, Mount{Root: l[3], Point: l[4], Options: strings.Split(r[2], ",")})
		case "cgroup2":
			out = append(out, Mount{Root: l[3], Point: l[4], V2: true})
		}
	}
	return out
}

// ParseProcCgroup maps each v1 controller of /proc/self/cgroup to this
// process's group path in its hierarchy; "" is the v2 group.
func ParseProcCgroup(procCgroup string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

func cgroupLimit() (float64, bool) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, false
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	return Limit(ParseMountinfo(string(mountinfo)), ParseProcCgroup(string(own)), os.ReadFile)
}

// Limit is the CPU bandwidth limit, in cores, of the group own names in
// the hierarchy of mounts that has the cpu controller (v1, else v2), the
// least of the group's and every group's above it up to the mount, read
// with read; false where no group on the way has a limit.
func Limit(mounts []Mount, own map[string]string, read func(string) ([]byte, error)) (float64, bool) {
	limit, found := 0.0, false
	note := func(cores float64, ok bool) {
		if ok && (!found || cores < limit) {
			limit, found = cores, true
		}
	}
	for _, m := range mounts {
		path, ok := own["cpu"]
		limitAt := v1Limit
		switch {
		case m.V2:
			path, ok = own[""]
			limitAt = v2Limit
		case !slices.Contains(m.Options, "cpu"):
			continue
		}
		if !ok {
			continue
		}
		for _, dir := range upTo(m.Join(path), m.Point) {
			note(limitAt(dir, read))
		}
		if !m.V2 {
			return limit, found // the v1 hierarchy with the cpu controller rules
		}
	}
	return limit, found
}

// upTo lists dir and the directories above it, up to top.
func upTo(dir, top string) []string {
	out := []string{dir}
	for dir != top && strings.HasPrefix(dir, top) && dir != filepath.Dir(dir) {
		dir = filepath.Dir(dir)
		out = append(out, dir)
	}
	return out
}

// v1Limit reads cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
func v1Limit(dir string, read func(string) ([]byte, error)) (float64, bool) {
	quota, ok := readInt(filepath.Join(dir, "cpu.cfs_quota_us"), read)
	if !ok || quota <= 0 {
		return 0, false
	}
	period, ok := readInt(filepath.Join(dir, "cpu.cfs_period_us"), read)
	if !ok || period <= 0 {
		return 0, false
	}
	return float64(quota) / float64(period), true
}

// v2Limit reads cpu.max: "<quota> <period>", or "max <period>" for none.
func v2Limit(dir string, read func(string) ([]byte, error)) (float64, bool) {
	b, err := read(filepath.Join(dir, "cpu.max"))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0, false
	}
	quota, err1 := strconv.ParseInt(f[0], 10, 64)
	period, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0, false
	}
	return float64(quota) / float64(period), true
}

func readInt(path string, read func(string) ([]byte, error)) (int64, bool) {
	b, err := read(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}
