package testenv

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RunNATS is StartNATS for code without a testing.TB, such as an Example
// function: a standalone embedded nats-server with JetStream on a free
// 127.0.0.1 port, its store in a new temporary directory. stop shuts the
// server down and removes the directory.
func RunNATS() (n *NATS, stop func(), err error) {
	dir, err := os.MkdirTemp("", "testenv-nats-")
	if err != nil {
		return nil, nil, fmt.Errorf("testenv: %w", err)
	}
	log, err := openNATSLog(filepath.Join(dir, "nats.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("testenv: %w", err)
	}
	n = &NATS{name: "testenv", storeDir: filepath.Join(dir, "store"), log: log}
	stop = func() {
		n.Shutdown()
		_ = n.log.close()
		_ = os.RemoveAll(dir)
	}
	if err := n.boot(); err != nil {
		stop()
		return nil, nil, fmt.Errorf("testenv: start nats-server: %w", err)
	}
	var problem string
	if !waitFor(natsHealthyTimeout, func() bool {
		problem = n.healthProblem()
		return problem == ""
	}) {
		stop()
		return nil, nil, fmt.Errorf("testenv: nats-server not healthy within %s: %s", natsHealthyTimeout, problem)
	}
	return n, stop, nil
}

// RunJetStream is RunNATS with a JetStream handle on a connection to the
// server, for an Example function that needs only the handle. stop closes
// the connection, then stops the server.
func RunJetStream() (js jetstream.JetStream, stop func(), err error) {
	n, stopServer, err := RunNATS()
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(n.URL())
	if err != nil {
		stopServer()
		return nil, nil, fmt.Errorf("testenv: connect: %w", err)
	}
	stop = func() { nc.Close(); stopServer() }
	if js, err = jetstream.New(nc); err != nil {
		stop()
		return nil, nil, fmt.Errorf("testenv: jetstream: %w", err)
	}
	return js, stop, nil
}
