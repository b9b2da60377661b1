package recoverer_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.RunAsynqChild()
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}
