//go:build linux

package testenv

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the child when the test binary dies, so
// a test that panics or times out does not leave redis-server processes behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processAlive reports whether a process with this pid exists on this host.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
