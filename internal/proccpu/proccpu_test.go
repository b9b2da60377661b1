package proccpu_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/proccpu"
	"github.com/cronstream/cronstream/internal/testenv"
)

// childEnv makes the test binary print Cores and exit (TestMain).
const childEnv = "PROCCPU_TEST_PRINT_CORES"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// Started before it is moved into its group (cgroup v1): wait
		// for the limit to show, a little.
		c := proccpu.Cores()
		for end := time.Now().Add(5 * time.Second); c >= float64(runtime.GOMAXPROCS(0)) && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
			c = proccpu.Cores()
		}
		fmt.Println(c)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestCoresInCPUGroup: a process in a cgroup limited to a quarter of a
// core sees a quarter of a core.
func TestCoresInCPUGroup(t *testing.T) {
	g, err := testenv.NewCPUGroup(t, "proccpu", 0.25)
	if errors.Is(err, testenv.ErrNoCPUGroup) {
		// Making a group needs root and a writable cgroup cpu
		// controller; CI machines have both, a laptop may not.
		t.Skipf("no CPU group can be made on this machine (root and a writable cgroup cpu controller are needed): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "GOMAXPROCS=2")
	var out strings.Builder
	cmd.Stdout = &out
	if err := g.Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	got, err := strconv.ParseFloat(strings.TrimSpace(out.String()), 64)
	if err != nil || math.Abs(got-0.25) > 0.001 {
		t.Errorf("Cores in a group of 0.25 core: %q (%v)", out.String(), err)
	}
}
