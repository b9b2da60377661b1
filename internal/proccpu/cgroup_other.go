//go:build !linux

package proccpu

// cgroupLimit: cgroups are Linux only.
func cgroupLimit() (float64, bool) { return 0, false }
