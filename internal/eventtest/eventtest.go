// Package eventtest writes events as their publishers do, for tests that
// publish, store or decode them: the wire form of an event built from its
// parts, the test failing if it cannot be built. It is for tests only;
// non-test code must not import it. (contract's own tests cannot use it:
// it imports contract.)
package eventtest

import (
	"testing"
	"time"

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
