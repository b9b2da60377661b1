//go:build linux

package testenv

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cronstream/cronstream/internal/proccpu"
)

func TestPickCPUHierarchy(t *testing.T) {
	const (
		hybridMounts = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw`
		hybridOwn = `4:memory:/process_api/00107a
2:cpuacct:/
1:cpu:/
0::/`
		v2Mounts = `25 19 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot`
		v2Own    = `0::/user.slice/user-0.slice/session-1.scope`
	)
	session := "/sys/fs/cgroup/user.slice/user-0.slice/session-1.scope"
	refuse := func(dir string) error { return fmt.Errorf("no cpu below %s", dir) }
	for _, tc := range []struct {
		name     string
		mounts   string
		own      string
		delegate func(dir string) error
		wantDir  string
		wantV2   bool
		wantErr  []string // each in the error, which wraps ErrNoCPUGroup
	}{
		{name: "v1 cpu beside an empty v2 (hybrid)", mounts: hybridMounts, own: hybridOwn, delegate: refuse,
			wantDir: "/sys/fs/cgroup/cpu"},
		{name: "v1 cpu and cpuacct mounted together", mounts: `30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct`,
			own: "3:cpu,cpuacct:/user.slice", delegate: refuse, wantDir: "/sys/fs/cgroup/cpu,cpuacct/user.slice"},
		{name: "v1 in a container, its group mounted as the top", mounts: `30 25 0:26 /docker/abc /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu`,
			own: "3:cpu:/docker/abc/inner", delegate: refuse, wantDir: "/sys/fs/cgroup/cpu/inner"},
		{name: "v2, its own group can delegate", mounts: v2Mounts, own: v2Own,
			delegate: func(string) error { return nil }, wantDir: session, wantV2: true},
		{name: "v2, only the top can delegate", mounts: v2Mounts, own: v2Own,
			delegate: func(dir string) error {
				if dir == "/sys/fs/cgroup" {
					return nil
				}
				return refuse(dir)
			}, wantDir: "/sys/fs/cgroup", wantV2: true},
		{name: "v2, nowhere can delegate", mounts: v2Mounts, own: v2Own, delegate: refuse,
			wantErr: []string{"no cpu below " + session, "no cpu below /sys/fs/cgroup"}},
		{name: "v1 without the cpu controller, then v2", mounts: hybridMounts[strings.Index(hybridMounts, "33 "):], own: hybridOwn,
			delegate: func(string) error { return nil }, wantDir: "/sys/fs/cgroup/unified", wantV2: true},
		{name: "no cgroup mounted", mounts: `22 1 0:21 / /proc rw - proc proc rw`, own: "", delegate: refuse,
			wantErr: []string{"no cgroup hierarchy with the cpu controller"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, v2, err := pickCPUHierarchy(proccpu.ParseMountinfo(tc.mounts), proccpu.ParseProcCgroup(tc.own), tc.delegate)
			if tc.wantErr != nil {
				if !errors.Is(err, ErrNoCPUGroup) {
					t.Fatalf("got %q, %v, %v; want an error wrapping ErrNoCPUGroup", dir, v2, err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil || dir != tc.wantDir || v2 != tc.wantV2 {
				t.Fatalf("got %q, v2 %v, %v; want %q, v2 %v", dir, v2, err, tc.wantDir, tc.wantV2)
			}
		})
	}
}
