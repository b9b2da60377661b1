package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// batchPublisher publishes a batch of messages to JetStream and waits for
// the stream's acknowledgements, the way jetstream's PublishMsgAsync does,
// at a fraction of its cost per message: the relay publishes one event per
// fire, and the general-purpose path (a future, two channels, a map entry
// and a JSON decode per acknowledgement) costs a noticeable share of a
// replica's CPU at that rate (BenchmarkSteadyEvery1s profiles it).
//
// Each batch gets an id; message i of batch b asks for its acknowledgement
// on <inbox>.<b>.<i>, and one wildcard subscription files each answer under
// its batch and index. An answer for a batch nobody waits for any more (it
// timed out) is dropped: that record stays in the outbox, is published
// again, and the stream's duplicate window drops the second copy.
type batchPublisher struct {
	nc     *nats.Conn
	stream string

	mu      sync.Mutex
	sub     *nats.Subscription
	inbox   string // "<inbox prefix>." ; the subscription listens on inbox+">"
	nextID  uint64
	batches map[uint64]*pubBatch
}

// pubBatch is one batch's acknowledgements.
type pubBatch struct {
	msgs     []pubMsg
	errs     []error // per message: nil once stored
	answered []bool
	retries  []uint8
	left     int
	done     chan struct{} // closed when every message is answered
}

// A stream without a leader for a moment (an election in a cluster)
// answers "no responders"; such a message is sent again after
// noResponderWait, up to noResponderRetries times, as jetstream's
// PublishMsgAsync does by default.
const (
	noResponderRetries = 2
	noResponderWait    = 250 * time.Millisecond
)

func newBatchPublisher(nc *nats.Conn, stream string) *batchPublisher {
	return &batchPublisher{nc: nc, stream: stream, batches: make(map[uint64]*pubBatch)}
}

// pubMsg is one message to publish.
type pubMsg struct {
	subject string
	msgID   string
	data    []byte
	// unconfirmed, when set, is the events.HeaderRedisUnconfirmed value:
	// its record's Redis write was not confirmed by the replicas.
	unconfirmed string
	// dupSeq is set by publish when the stream answered that a message
	// with this id is stored already, at that sequence.
	dupSeq uint64
}

// publish sends msgs in order and returns how many leading messages the
// stream stored (a duplicate counts: it is stored already), and the error
// that stopped the count. It waits at most timeout, and not after ctx ends.
func (p *batchPublisher) publish(ctx context.Context, msgs []pubMsg, timeout time.Duration) (int, error) {
	return p.send(msgs, timeout).wait(ctx)
}

// sentBatch is a batch sent to the stream whose acknowledgements may still
// be on their way: the relay reads and deletes outbox records meanwhile.
type sentBatch struct {
	p        *batchPublisher
	b        *pubBatch
	id       uint64
	sent     int
	err      error // the send's own failure (the count stops before it)
	timeout  time.Duration
	deadline time.Time
}

// send sends msgs in order without waiting for their acknowledgements;
// wait collects them, until timeout from now.
func (p *batchPublisher) send(msgs []pubMsg, timeout time.Duration) *sentBatch {
	sb := &sentBatch{p: p, timeout: timeout, deadline: time.Now().Add(timeout)}
	if len(msgs) == 0 {
		return sb
	}
	b := &pubBatch{
		msgs: msgs, errs: make([]error, len(msgs)), answered: make([]bool, len(msgs)),
		retries: make([]uint8, len(msgs)), left: len(msgs), done: make(chan struct{}),
	}
	id, inbox, err := p.register(b)
	if err != nil {
		sb.err = err
		return sb
	}
	sb.b, sb.id = b, id
	reply := make([]byte, 0, len(inbox)+24)
	reply = strconv.AppendUint(append(reply, inbox...), id, 10)
	reply = append(reply, '.')
	base := len(reply)
	// PublishMsg copies the message into the connection's buffer before it
	// returns, so one Msg and one header map serve the whole batch.
	msg := &nats.Msg{Header: nats.Header{jetstream.MsgIDHeader: []string{""}, jetstream.ExpectedStreamHeader: []string{p.stream}}}
	for i := range msgs {
		setPubMsg(msg, &msgs[i], reply[:base], i)
		if sb.err = p.nc.PublishMsg(msg); sb.err != nil {
			break
		}
		sb.sent++
	}
	return sb
}

// wait waits for the acknowledgements of a sent batch (until its deadline,
// and not after ctx ends) and returns how many leading messages the stream
// stored, and the error that stopped the count.
func (sb *sentBatch) wait(ctx context.Context) (int, error) {
	if sb.b == nil {
		return 0, sb.err
	}
	p, b, timeout := sb.p, sb.b, time.Until(sb.deadline)
	if sb.sent > 0 {
		t := time.NewTimer(max(timeout, 0))
		select {
		case <-b.done:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Unregistered under the lock that answers take: no late answer
	// writes into msgs once wait has returned.
	delete(p.batches, sb.id)
	for i := range sb.sent {
		switch {
		case !b.answered[i] && ctx.Err() != nil:
			return i, errors.Join(sb.err, fmt.Errorf("wait for the stream's acknowledgement: %w", ctx.Err()))
		case !b.answered[i]:
			return i, errors.Join(sb.err, fmt.Errorf("wait for the stream's acknowledgement: none from %s within %s", p.stream, sb.timeout))
		case b.errs[i] != nil:
			return i, errors.Join(sb.err, b.errs[i])
		}
	}
	return sb.sent, sb.err
}

// register files b under a new id, subscribing to the inbox on first use.
func (p *batchPublisher) register(b *pubBatch) (uint64, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sub == nil {
		inbox := p.nc.NewRespInbox() + "."
		sub, err := p.nc.Subscribe(inbox+">", func(m *nats.Msg) { p.answer(inbox, m) })
		if err != nil {
			return 0, "", fmt.Errorf("subscribe to acknowledgements: %w", err)
		}
		p.sub, p.inbox = sub, inbox
	}
	p.nextID++
	p.batches[p.nextID] = b
	return p.nextID, p.inbox, nil
}

// answer files one acknowledgement that arrived on inbox.
func (p *batchPublisher) answer(inbox string, m *nats.Msg) {
	tail, ok := strings.CutPrefix(m.Subject, inbox)
	if !ok {
		return
	}
	bs, is, ok := strings.Cut(tail, ".")
	if !ok {
		return
	}
	id, err1 := strconv.ParseUint(bs, 10, 64)
	i, err2 := strconv.Atoi(is)
	if err1 != nil || err2 != nil {
		return
	}
	ackErr := parseAck(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.batches[id]
	if b == nil || i < 0 || i >= len(b.answered) || b.answered[i] {
		return
	}
	if errors.Is(ackErr, jetstream.ErrNoStreamResponse) && b.retries[i] < noResponderRetries {
		b.retries[i]++
		m := b.msgs[i]
		time.AfterFunc(noResponderWait, func() {
			p.mu.Lock()
			waiting := p.batches[id] == b
			p.mu.Unlock()
			if waiting {
				msg := &nats.Msg{Header: nats.Header{jetstream.MsgIDHeader: []string{""}, jetstream.ExpectedStreamHeader: []string{p.stream}}}
				setPubMsg(msg, &m, []byte(inbox+strconv.FormatUint(id, 10)+"."), i)
				// A failed send leaves the message unanswered: the batch
				// times out and the record is published again later.
				_ = p.nc.PublishMsg(msg)
			}
		})
		return
	}
	b.answered[i], b.errs[i] = true, ackErr
	if ackErr == nil {
		b.msgs[i].dupSeq = duplicateSeq(m.Data)
	}
	if b.left--; b.left == 0 {
		close(b.done)
	}
}

// setPubMsg makes msg carry m, asking for its answer on replyBase + i
// (replyBase is "<inbox><batch>.").
func setPubMsg(msg *nats.Msg, m *pubMsg, replyBase []byte, i int) {
	msg.Subject, msg.Data = m.subject, m.data
	msg.Reply = string(strconv.AppendInt(replyBase, int64(i), 10))
	msg.Header[jetstream.MsgIDHeader][0] = m.msgID
	if m.unconfirmed != "" {
		msg.Header[events.HeaderRedisUnconfirmed] = []string{m.unconfirmed}
	} else {
		delete(msg.Header, events.HeaderRedisUnconfirmed)
	}
}

// close stops listening for acknowledgements.
func (p *batchPublisher) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sub != nil {
		_ = p.sub.Unsubscribe()
		p.sub = nil
	}
}

// duplicateSeq reads the sequence of the stored message from a successful
// acknowledgement that says "duplicate" (0 for any other).
func duplicateSeq(ack []byte) uint64 {
	// The server writes `"duplicate": true` or `"duplicate":true`
	// depending on the path: look for the name, then decode.
	if !bytes.Contains(ack, []byte(`"duplicate"`)) {
		return 0
	}
	var a struct {
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
	}
	if json.Unmarshal(ack, &a) != nil || !a.Duplicate {
		return 0
	}
	return a.Seq
}

// parseAck reads JetStream's answer to a publish: nil when the message is
// stored (or was already, as a duplicate).
//
// The server writes a success as {"stream":…,"seq":…} and a failure with
// "error" as its first member (JSPubAckResponse puts Error before the
// embedded PubAck), so a success is recognised by its first bytes; anything
// else is decoded in full. An empty message with a status header is the
// server's "no responders" or another status, never a success.
func parseAck(m *nats.Msg) error {
	if bytes.HasPrefix(m.Data, []byte(`{"stream":"`)) {
		return nil
	}
	if len(m.Data) == 0 {
		if st := m.Header.Get("Status"); st != "" {
			if st == "503" {
				return fmt.Errorf("publish to %s: %w", m.Subject, jetstream.ErrNoStreamResponse)
			}
			return fmt.Errorf("publish: status %s %s", st, m.Header.Get("Description"))
		}
		return errors.New("publish: empty acknowledgement")
	}
	var ack struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     uint16 `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Stream string `json:"stream"`
	}
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		return fmt.Errorf("publish: unreadable acknowledgement %q: %w", m.Data, err)
	}
	if ack.Error != nil {
		return fmt.Errorf("publish refused by the stream: %s (code %d, err_code %d)", ack.Error.Description, ack.Error.Code, ack.Error.ErrCode)
	}
	if ack.Stream == "" {
		return fmt.Errorf("publish: acknowledgement without stream %q", m.Data)
	}
	return nil
}
