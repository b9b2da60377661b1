package testenv

import "go.uber.org/goleak"

// LeakOptions are the options every package's goleak check takes. They
// ignore the one goroutine an embedded nats-server leaves behind its
// shutdown: a stream's setup of its source consumer waits for the answer
// on a timer of its own (30 s), not on the server's quit, and ends when
// that timer does. It is the server's, never ours.
func LeakOptions(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
	}, extra...)
}
