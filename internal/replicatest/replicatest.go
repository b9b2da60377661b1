// Package replicatest runs whole replicas for the tests of the packages a
// replica wires together. It is for tests only; non-test code must not
// import it. (It cannot live in testenv: replica's own tests import testenv.)
package replicatest

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/replica"
)

// stopWithin bounds how long a replica may take to be ready and to stop.
const stopWithin = 30 * time.Second

// Replica is a replica a test runs.
type Replica struct {
	// Addr is the replica's HTTP address.
	Addr string

	id     string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// Start runs replica.Run with cfg until the test ends (or Stop) and
// returns the replica once it is ready. What cfg leaves unset a test rarely
// wants otherwise: HTTPAddr a free port of 127.0.0.1, a 200 ms Heartbeat
// and a Logger that drops everything. At cleanup it stops the replica and
// fails the test if Run returns an error or does not return within 30 s.
func Start(t testing.TB, cfg replica.Config) *Replica {
	t.Helper()
	cfg.HTTPAddr = cmp.Or(cfg.HTTPAddr, "127.0.0.1:0")
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, 200*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ready := make(chan string, 1)
	if then := cfg.Ready; then != nil {
		cfg.Ready = func(addr string) { ready <- addr; then(addr) }
	} else {
		cfg.Ready = func(addr string) { ready <- addr }
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Replica{id: cfg.ReplicaID, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- replica.Run(ctx, cfg) }()
	t.Cleanup(func() {
		stopped := false
		r.once.Do(func() { r.err, stopped = r.wait(), true })
		if stopped && r.err != nil {
			t.Error(r.err)
		}
	})
	select {
	case r.Addr = <-ready:
		return r
	case err := <-r.done:
		t.Fatalf("replica %s ended before it was ready: %v", cfg.ReplicaID, err)
	case <-time.After(stopWithin):
		t.Fatalf("replica %s not ready within %s", cfg.ReplicaID, stopWithin)
	}
	return nil
}

// Stop stops the replica and waits for it, and returns Run's error or
// that it did not return within 30 s. Stopping again returns the same.
func (r *Replica) Stop() error {
	r.once.Do(func() { r.err = r.wait() })
	return r.err
}

func (r *Replica) wait() error {
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			return fmt.Errorf("replica %s: %w", r.id, err)
		}
		return nil
	case <-time.After(stopWithin):
		return fmt.Errorf("replica %s did not stop within %s", r.id, stopWithin)
	}
}
