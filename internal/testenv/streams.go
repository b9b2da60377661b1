package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// streamReadTimeout bounds how long StreamMsgs may take to read a stream,
// and how long it waits for any one message.
const streamReadTimeout = 30 * time.Second

// StreamMsgs returns every message stream holds, in stream order, read
// with an ordered consumer up to the last sequence when it was called.
func StreamMsgs(t testing.TB, js jetstream.JetStream, stream string) []jetstream.RawStreamMsg {
	t.Helper()
	ctx := Context(t, streamReadTimeout)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.RawStreamMsg
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read stream %s: %v", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, jetstream.RawStreamMsg{
			Subject: m.Subject(), Sequence: md.Sequence.Stream, Header: m.Headers(), Data: m.Data(), Time: md.Timestamp,
		})
		if md.Sequence.Stream >= info.State.LastSeq {
			return out
		}
	}
}

// StreamMsgCount is the number of messages stream holds, 0 when it cannot
// be read, for a condition polled while the stream may be unreachable.
func StreamMsgCount(js jetstream.JetStream, stream string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), streamReadTimeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}
