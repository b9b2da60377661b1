package proccpu

import (
	"io/fs"
	"testing"
)

func TestLimit(t *testing.T) {
	v1 := []Mount{
		{Root: "/", Point: "/sys/fs/cgroup/memory", Options: []string{"rw", "memory"}},
		{Root: "/", Point: "/sys/fs/cgroup/cpu,cpuacct", Options: []string{"rw", "cpu", "cpuacct"}},
	}
	v2 := []Mount{{Root: "/", Point: "/sys/fs/cgroup", V2: true}}
	for _, tc := range []struct {
		name   string
		mounts []Mount
		own    map[string]string
		files  map[string]string
		want   float64
		ok     bool
	}{
		{"v1 own group", v1, map[string]string{"cpu": "/a/b"}, map[string]string{
			"/sys/fs/cgroup/cpu,cpuacct/a/b/cpu.cfs_quota_us": "10000\n", "/sys/fs/cgroup/cpu,cpuacct/a/b/cpu.cfs_period_us": "100000\n",
			"/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us": "-1\n", "/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_period_us": "100000\n",
		}, 0.1, true},
		{"v1 a parent's lower limit", v1, map[string]string{"cpu": "/a/b"}, map[string]string{
			"/sys/fs/cgroup/cpu,cpuacct/a/b/cpu.cfs_quota_us": "150000", "/sys/fs/cgroup/cpu,cpuacct/a/b/cpu.cfs_period_us": "100000",
			"/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us": "50000", "/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_period_us": "100000",
		}, 0.5, true},
		{"v1 no limit", v1, map[string]string{"cpu": "/"}, map[string]string{
			"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
		}, 0, false},
		{"v2", v2, map[string]string{"": "/k/pod"}, map[string]string{
			"/sys/fs/cgroup/k/pod/cpu.max": "max 100000\n", "/sys/fs/cgroup/k/cpu.max": "200000 100000\n",
		}, 2, true},
		{"v2 no limit", v2, map[string]string{"": "/"}, map[string]string{"/sys/fs/cgroup/cpu.max": "max 100000"}, 0, false},
		{"nothing readable", v2, map[string]string{"": "/x"}, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := func(p string) ([]byte, error) {
				if s, ok := tc.files[p]; ok {
					return []byte(s), nil
				}
				return nil, fs.ErrNotExist
			}
			got, ok := Limit(tc.mounts, tc.own, read)
			if ok != tc.ok || got != tc.want {
				t.Errorf("Limit = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
