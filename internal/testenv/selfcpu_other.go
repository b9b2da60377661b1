//go:build !unix

package testenv

import "time"

// SelfCPU is 0 where the process's CPU time cannot be read.
func SelfCPU() time.Duration { return 0 }
