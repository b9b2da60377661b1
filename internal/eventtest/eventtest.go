// Package eventtest writes events as their publishers do, for tests that
// publish, store or decode them: the wire form of an event built from its
// parts, the test failing if it cannot be built, and the config events of
// many entries published at once straight on the config stream. It is for tests only;
// non-test code must not import it. (contract's own tests cannot use it:
// it imports contract.)
package eventtest

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
)

// MarshalAt returns the wire form of contract.NewEventAt(id, at, typ,
// source, subject, data).
func MarshalAt(tb testing.TB, id string, at time.Time, typ, source, subject string, data any) []byte {
	tb.Helper()
	ev, err := contract.NewEventAt(id, at, typ, source, subject, data)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := ev.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Marshal is MarshalAt with a fresh id and the current time, as
// contract.NewEvent.
func Marshal(tb testing.TB, typ, source, subject string, data any) []byte {
	tb.Helper()
	return MarshalAt(tb, contract.NewEventID(), time.Now(), typ, source, subject, data)
}

// Register publishes a registered event (source as its source) of each
// entry, as Publish.
func Register(tb testing.TB, js jetstream.JetStream, names contract.Names, source string, entries []contract.Entry, ackWithin time.Duration) {
	tb.Helper()
	Publish(tb, js, names, contract.TypeEntryRegistered, source, entries, ackWithin)
}

// Publish publishes an event of type typ (a registration or an update;
// source as its source) of each entry, normalized, straight to names'
// config stream: what `entry put` publishes, without its read of the
// entry first. It keeps at most 4096 publishes unacknowledged and fails
// the test when one is refused or not acknowledged within ackWithin.
func Publish(tb testing.TB, js jetstream.JetStream, names contract.Names, typ, source string, entries []contract.Entry, ackWithin time.Duration) {
	tb.Helper()
	futures := make([]jetstream.PubAckFuture, 0, 4096)
	wait := func() {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				tb.Fatal(err)
			case <-time.After(ackWithin):
				tb.Fatalf("config publish not acknowledged within %s", ackWithin)
			}
		}
		futures = futures[:0]
	}
	for _, e := range entries {
		e = e.Normalize()
		f, err := js.PublishAsync(names.ConfigSubject(e.ID), Marshal(tb, typ, source, e.ID, e))
		if err != nil {
			tb.Fatal(err)
		}
		if futures = append(futures, f); len(futures) == cap(futures) {
			wait()
		}
	}
	wait()
}
