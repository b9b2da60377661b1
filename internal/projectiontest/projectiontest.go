// Package projectiontest gives tests the projection a replica builds its
// view on: a projector caught up with a config stream. It is for tests
// only; non-test code must not import it. (It cannot live in replicatest:
// the packages a replica wires together, such as console, test with it.)
package projectiontest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/projector"
)

// CaughtUp starts a quiet projector of names on js, stopped when the test
// ends, and returns it once it has applied the config stream up to the
// stream's last sequence at the call. ctx bounds the start and the wait.
func CaughtUp(ctx context.Context, t testing.TB, js jetstream.JetStream, names contract.Names) *projector.Projector {
	t.Helper()
	p, err := projector.New(projector.Config{JS: js, Names: names, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	if err := p.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}
