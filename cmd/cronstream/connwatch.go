package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errNATSLost ends a long-running command told to stop when NATS goes away
// (--exit-on-disconnect); it maps to the exit status of an unavailable
// server.
var errNATSLost = fmt.Errorf("NATS went away (--exit-on-disconnect): %w", nats.ErrConnectionClosed)

// connCheckEvery is how often a long-running command checks that NATS and
// JetStream answer; with connCheckTimeout it bounds how long an outage goes
// unsaid: at most their sum.
const (
	connCheckEvery   = 2 * time.Second
	connCheckTimeout = 3 * time.Second
)

// natsWatch tells a long-running command's user when NATS or JetStream stop
// answering and when they are back, rather than leaving a follow or a watch
// waiting in silence. A server that is gone, a cut network and a JetStream
// without a leader look the same from here: a stream lookup that fails or
// does not answer in time.
type natsWatch struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string // a stream every role may look up
	w       io.Writer
	exit    bool // --exit-on-disconnect
	lostErr error
}

// watchNATS checks the connection until ctx ends. With exit set, the first
// outage cancels the command: cancel is called and lost reports why.
func watchNATS(ctx context.Context, cancel context.CancelFunc, s *session, w io.Writer, exit bool) (lost func() error, stop func()) {
	nw := &natsWatch{nc: s.nc, js: s.js, stream: s.names.ConfigStream(), w: w, exit: exit}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		nw.run(wctx, cancel)
	}()
	return func() error { <-done; return nw.lostErr }, func() { wcancel(); <-done }
}

func (nw *natsWatch) run(ctx context.Context, cancel context.CancelFunc) {
	t := time.NewTicker(connCheckEvery)
	defer t.Stop()
	down := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := nw.check(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && !down:
			down = true
			if nw.exit {
				fmt.Fprintf(nw.w, "cronstream: NATS is not answering (%s); exiting (--exit-on-disconnect)\n", terminalSafe(err.Error()))
				nw.lostErr = errNATSLost
				cancel()
				return
			}
			fmt.Fprintf(nw.w, "cronstream: NATS is not answering (%s); still trying, and carrying on from where it stopped once it is back\n", terminalSafe(err.Error()))
		case err == nil && down:
			down = false
			fmt.Fprintln(nw.w, "cronstream: NATS is back; carrying on")
		}
	}
}

// check asks JetStream for a stream's info: it answers only when the
// connection, the server and JetStream all work.
func (nw *natsWatch) check(ctx context.Context) error {
	if !nw.nc.IsConnected() {
		return fmt.Errorf("connection %s", nw.nc.Status())
	}
	cctx, cancel := context.WithTimeout(ctx, connCheckTimeout)
	defer cancel()
	_, err := nw.js.Stream(cctx, nw.stream)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("JetStream did not answer within %s", connCheckTimeout)
	}
	return err
}
