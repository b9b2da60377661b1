package taskstate

import (
	"os"
	"testing"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestMain lets the test binary double as the real asynq worker that
// TestRecoverKilledWorker kills (testenv.StartAsynqChild).
func TestMain(m *testing.M) {
	testenv.RunAsynqChild()
	os.Exit(m.Run())
}
