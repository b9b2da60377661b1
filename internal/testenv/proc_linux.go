//go:build linux

package testenv

import (
	"os"
	"os/exec"
	"syscall"
)

// DieWithParent makes the kernel kill the child cmd starts when the test
// binary dies, so a test that panics or times out leaves no process behind
// (redis-server, nats-server, or a test's own replicas and workers).
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processAlive reports whether a process with this pid exists on this host.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}

// freeze stops (true) or continues (false) a process, as SIGSTOP and
// SIGCONT do: a frozen server holds its connections and answers nothing.
// It signals through p, never by a bare pid: once p has exited and been
// waited for, its pid may belong to another test's process (pids wrap
// quickly when test suites spawn thousands), and a SIGCONT sent to it
// woke a replica another test had frozen.
func freeze(p *os.Process, stop bool) error {
	if stop {
		return p.Signal(syscall.SIGSTOP)
	}
	return p.Signal(syscall.SIGCONT)
}
