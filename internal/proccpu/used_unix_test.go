//go:build unix

package proccpu_test

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/proccpu"
)

// TestUsedGrows: the CPU this process spends shows in Used.
func TestUsedGrows(t *testing.T) {
	before, ok := proccpu.Used()
	if !ok {
		t.Fatal("the process's CPU time cannot be read")
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	after, _ := proccpu.Used()
	if d := after - before; d < 20*time.Millisecond {
		t.Errorf("50 ms of spinning added %s of CPU time", d)
	}
}
