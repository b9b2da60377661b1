//go:build !linux

package testenv

import (
	"fmt"
	"os/exec"
	"testing"
)

// CPUGroup is a cgroup limiting its processes' CPU; cgroups are Linux
// only, so NewCPUGroup always refuses here.
type CPUGroup struct{}

// NewCPUGroup refuses with ErrNoCPUGroup: cgroups are Linux only.
func NewCPUGroup(t testing.TB, name string, cores float64) (*CPUGroup, error) {
	if _, err := cpuQuota(cores); err != nil {
		return nil, err
	}
	if err := validGroupName(name); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: cgroups are Linux only", ErrNoCPUGroup)
}

// Dir is empty: no group exists here.
func (g *CPUGroup) Dir() string { return "" }

// Start is never reached (no group is ever made); it refuses.
func (g *CPUGroup) Start(*exec.Cmd) error { return ErrNoCPUGroup }

// Stat refuses: no group exists here.
func (g *CPUGroup) Stat() (CPUGroupStat, error) { return CPUGroupStat{}, ErrNoCPUGroup }
