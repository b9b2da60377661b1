//go:build !linux

package testenv

import (
	"errors"
	"os"
	"os/exec"
)

// DieWithParent is a no-op where the kernel offers no parent-death signal;
// cleanup still stops every process a passing or failing test started.
func DieWithParent(*exec.Cmd) {}

// processAlive assumes every process is alive where it cannot be checked, so
// claims are only ever freed by their owner or by expiry.
func processAlive(int) bool { return true }

// freeze is unsupported where processes cannot be stopped and continued.
func freeze(*os.Process, bool) error { return errors.New("freezing a process needs Linux") }
