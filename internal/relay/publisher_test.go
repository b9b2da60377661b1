package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestBatchPublisher: against a real JetStream, what the publisher counts
// as stored is what the stream holds, in order; duplicates count as stored;
// a refusal, a subject no stream listens on and a lost answer each stop the
// count at that message.
func TestBatchPublisher(t *testing.T) {
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PUBTEST", Subjects: []string{"pt.>"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	nc := n.Connect(t)
	p := newBatchPublisher(nc, "PUBTEST")
	defer p.close()
	msgs := func(subjects ...string) []pubMsg {
		out := make([]pubMsg, len(subjects))
		for i, s := range subjects {
			out[i] = pubMsg{subject: s, msgID: fmt.Sprintf("id-%s-%d", s, i), data: []byte(`{"n":` + fmt.Sprint(i) + `}`)}
		}
		return out
	}

	batch := msgs("pt.a", "pt.b", "pt.c", "pt.d")
	if stored, err := p.publish(ctx, batch, 5*time.Second); stored != 4 || err != nil {
		t.Fatalf("first batch: stored %d, err %v", stored, err)
	}
	// The same ids again: duplicates, stored already, nothing added.
	if stored, err := p.publish(ctx, batch, 5*time.Second); stored != 4 || err != nil {
		t.Fatalf("republished batch: stored %d, err %v", stored, err)
	}
	if got := testenv.StreamMsgCount(js, "PUBTEST"); got != 4 {
		t.Fatalf("stream holds %d messages, want 4", got)
	}

	// A subject of another stream: the expected-stream header makes that
	// stream refuse it; the count stops there.
	stored, err := p.publish(ctx, msgs("pt.e", "other.x", "pt.f"), 5*time.Second)
	if stored != 1 || err == nil || !strings.Contains(err.Error(), "refused by the stream") {
		t.Fatalf("batch with a refused message: stored %d, err %v", stored, err)
	}

	// No stream listens: "no responders", retried, then reported.
	start := time.Now()
	stored, err = p.publish(ctx, msgs("nowhere.a"), 5*time.Second)
	if stored != 0 || !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("publish to no stream: stored %d, err %v", stored, err)
	}
	if d := time.Since(start); d < noResponderRetries*noResponderWait {
		t.Fatalf("no-responders answer reported after %s, before its retries", d)
	}

	// Answers that never come: the wait ends at the timeout, or at once
	// when ctx ends.
	silent := newBatchPublisher(nc, "PUBTEST")
	defer silent.close()
	if _, _, err := silent.register(&pubBatch{done: make(chan struct{})}); err != nil {
		t.Fatal(err)
	}
	silent.inbox = "lost." // answers go where nobody listens
	if _, err := nc.Subscribe("lost.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	stored, err = silent.publish(ctx, msgs("pt.g"), 300*time.Millisecond)
	if stored != 0 || err == nil || !strings.Contains(err.Error(), "within") || time.Since(start) > 3*time.Second {
		t.Fatalf("unanswered publish: stored %d, err %v after %s", stored, err, time.Since(start))
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	stored, err = silent.publish(cctx, msgs("pt.h"), time.Minute)
	if stored != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("publish with an ended context: stored %d, err %v", stored, err)
	}
}

func TestParseAck(t *testing.T) {
	h := func(kv ...string) nats.Header {
		out := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	for _, tc := range []struct {
		name string
		msg  nats.Msg
		ok   bool
		want string
	}{
		{"stored", nats.Msg{Data: []byte(`{"stream":"S","seq":7}`)}, true, ""},
		{"duplicate", nats.Msg{Data: []byte(`{"stream":"S","seq":7,"duplicate":true}`)}, true, ""},
		{"domain first", nats.Msg{Data: []byte(`{"domain":"hub","stream":"S","seq":7}`)}, true, ""},
		{"error", nats.Msg{Data: []byte(`{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"},"stream":"S","seq":0}`)}, false, "expected stream does not match"},
		{"no responders", nats.Msg{Header: h("Status", "503")}, false, "no response from stream"},
		{"other status", nats.Msg{Header: h("Status", "408", "Description", "Request Timeout")}, false, "status 408"},
		{"empty", nats.Msg{}, false, "empty"},
		{"garbage", nats.Msg{Data: []byte(`nope`)}, false, "unreadable"},
		{"no stream", nats.Msg{Data: []byte(`{"seq":1}`)}, false, "without stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseAck(&tc.msg)
			if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("parseAck = %v, want ok=%t containing %q", err, tc.ok, tc.want)
			}
		})
	}
}
