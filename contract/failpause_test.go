package contract

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestHeaderNamesAreNATSs: the header names a fail-pause request is read
// by are NATS's own, spelled here so the contract needs no NATS import.
func TestHeaderNamesAreNATSs(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{headerMsgID, jetstream.MsgIDHeader},
		{headerExpectedLastSubjSeq, jetstream.ExpectedLastSubjSeqHeader},
		{headerExpectedLastSubjSeqSubj, jetstream.ExpectedLastSubjSeqSubjHeader},
		{relayHeaders[0], jetstream.StreamHeader},
		{relayHeaders[1], jetstream.SubjectHeader},
		{relayHeaders[2], jetstream.SequenceHeader},
		{relayHeaders[3], jetstream.TimeStampHeaer},
	} {
		if c.got != c.want {
			t.Errorf("header %q, NATS names it %q", c.got, c.want)
		}
	}
}
