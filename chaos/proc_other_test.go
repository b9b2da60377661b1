//go:build !linux

package chaos

import "os/exec"

// dieWithParent is a no-op where the kernel has no parent-death signal; the
// tests' cleanup still stops every process they started.
func dieWithParent(*exec.Cmd) {}
