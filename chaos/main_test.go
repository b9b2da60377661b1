package chaos

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions(goleak.Cleanup(func(int) { removeBinaries() }))...)
}
