package testenv

import "go.uber.org/goleak"

// LeakOptions are the options every package's goleak check takes. They
// ignore the goroutines an embedded nats-server leaves behind its
// shutdown: a stream's setup of its source or mirror consumer waits for
// the answer on a timer of its own (30 s), not on the server's quit, and
// ends when that timer does. They are the server's, never ours.
func LeakOptions(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).setupMirrorConsumer.func3"),
	}, extra...)
}
