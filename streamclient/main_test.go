package streamclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/errtree"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

// testCtx is a context that ends with the test, bounded so a hang fails
// instead of stalling the package.
func testCtx(t testing.TB) context.Context { return testenv.Context(t, 45*time.Second) }

// validEntry is a small valid entry.
func validEntry(id string) contract.Entry {
	return contract.Entry{
		ID:   id,
		Cron: "*/5 * * * *",
		Task: contract.Task{Type: "report:daily", Payload: []byte(`{"team":"ops"}`)},
	}
}

// newSingle starts a single embedded node, ensures the streams (R1) under
// a prefix of the test's own and returns a client on it.
func newSingle(t testing.TB, prefix string) (*testenv.NATS, jetstream.JetStream, *Client) {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	names := contract.MustNames(prefix)
	if err := EnsureStreams(testCtx(t), js, StreamConfig{Names: names}); err != nil {
		t.Fatalf("EnsureStreams: %v", err)
	}
	return n, js, NewClient(js, names, WithSource("cronstream/test"))
}

// fieldsOf returns the Field of every *FieldError in err's tree.
func fieldsOf(err error) []string {
	return errtree.Collect(err, func(fe *contract.FieldError) string { return fe.Field })
}

// conflictOf returns err's *ConflictError or fails the test.
func conflictOf(t testing.TB, err error) *ConflictError {
	t.Helper()
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrRevisionConflict) {
		t.Fatalf("error %v: want a *ConflictError matching ErrRevisionConflict", err)
	}
	return ce
}
