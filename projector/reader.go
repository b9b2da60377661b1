package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

const (
	// DefaultHeartbeat is the consumer's idle heartbeat. A dead consumer is
	// noticed after two missed heartbeats, and LastHeard lags the stream by
	// at most about four heartbeats on an idle stream.
	DefaultHeartbeat = 2 * time.Second

	// pullBatch is how many messages one pull request asks for. Counted in
	// messages, not bytes: a byte limit below one message's size would stall
	// the consumer on that message forever.
	pullBatch = 1024

	// consumerInactive lets the server delete a consumer its reader no
	// longer reads: readers never delete consumers (a role that may delete
	// consumers could delete other clients' too, so none may), and a
	// reader that was merely disconnected that long makes a new one.
	consumerInactive = time.Minute

	// createTimeout is the first consumer create attempt's timeout; it
	// doubles per failed attempt up to maxCreateTimeout. A request that
	// lands while a cluster elects a leader is never answered, so a short
	// first timeout is what makes fail-over fast.
	createTimeout    = 2 * time.Second
	maxCreateTimeout = 16 * time.Second

	minBackoff = 50 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// errIdle is returned by orderedReader.next when a wait passed with no
// message but with the consumer's heartbeats arriving: the stream is alive.
var errIdle = errors.New("no message, heartbeats arriving")

// errStreamReplaced is returned by orderedReader.next when, about to resume
// after the last sequence it returned, it finds the stream is no longer the
// one it was reading: created at another time, ending before that sequence,
// or holding another message there (deleted and recreated, or restored from
// an older snapshot). Resuming would skip or misread the new stream.
var errStreamReplaced = errors.New("stream was recreated or restored")

// orderedReader reads a stream in order, without gap or duplicate, through
// an ephemeral in-memory consumer (what the jetstream package calls an
// ordered consumer). It checks that consumer sequences follow each other and
// that heartbeats arrive; on a gap, a missed heartbeat, a deleted consumer
// or any other failure it makes a new consumer that starts after the last
// stream sequence it returned, retrying with backoff until it succeeds or
// its context ends.
//
// It does this itself rather than use jetstream.OrderedConsumer, whose
// recovery runs inside Next with a fixed 10 s request timeout that no
// context can cut short: on a 3-node cluster, losing the node that leads
// both the stream and the JetStream meta group stalls it for those 10 s,
// where retrying with short timeouts recovers in about two seconds.
//
// One goroutine owns a reader.
type orderedReader struct {
	js      jetstream.JetStream
	stream  string
	filters []string
	// policy applies while nothing has been read; after that the reader
	// always resumes by sequence.
	policy jetstream.DeliverPolicy
	hb     time.Duration
	log    *slog.Logger

	cons      jetstream.Consumer
	it        jetstream.MessagesContext
	delivered uint64 // consumer sequence of the last message from cons
	last      uint64 // stream sequence of the last message returned
	resets    uint64
	// created is the stream's creation time when the reader first opened;
	// lastSubject and lastAt identify the message at last
	// (events.ConfigMessageID). A reopen checks the stream still matches.
	created     time.Time
	lastSubject string
	lastAt      time.Time
}

// restart makes the reader read the stream from the start (by policy) as a
// new stream.
func (r *orderedReader) restart() {
	r.close()
	r.last, r.lastSubject, r.lastAt, r.created = 0, "", time.Time{}, time.Time{}
}

// sameStream returns why the stream is not the one the reader has been
// reading, or "" when it is (or cannot be told apart).
func (r *orderedReader) sameStream(ctx context.Context) (string, error) {
	stream, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return "", fmt.Errorf("look up stream %s: %w", r.stream, err)
	}
	info := stream.CachedInfo()
	if r.created.IsZero() {
		r.created = info.Created
		return "", nil
	}
	switch {
	case !info.Created.Equal(r.created):
		return fmt.Sprintf("created at %s, was %s", info.Created.UTC().Format(time.RFC3339Nano), r.created.UTC().Format(time.RFC3339Nano)), nil
	case r.last == 0:
		return "", nil
	case info.State.LastSeq < r.last:
		return fmt.Sprintf("last sequence %d is below %d already read", info.State.LastSeq, r.last), nil
	}
	m, err := stream.GetMsg(ctx, r.last)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Deleted or aged out: nothing to compare with.
		return "", nil
	case err != nil:
		return "", fmt.Errorf("get message %d of %s: %w", r.last, r.stream, err)
	}
	if got, want := events.ConfigMessageID(m.Subject, m.Time), events.ConfigMessageID(r.lastSubject, r.lastAt); got != want {
		return fmt.Sprintf("message at sequence %d has id %s, was %s", r.last, got, want), nil
	}
	return "", nil
}

func (r *orderedReader) open(ctx context.Context, timeout time.Duration) error {
	cfg := jetstream.ConsumerConfig{
		DeliverPolicy:     r.policy,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubjects:    r.filters,
		InactiveThreshold: consumerInactive,
		Replicas:          1,
		MemoryStorage:     true,
	}
	if r.last > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = r.last + 1
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	why, err := r.sameStream(cctx)
	if err != nil {
		return err
	}
	if why != "" {
		return fmt.Errorf("%w: %s: %s", errStreamReplaced, r.stream, why)
	}
	cons, err := r.js.CreateOrUpdateConsumer(cctx, r.stream, cfg)
	if err != nil {
		return fmt.Errorf("create consumer on %s after seq %d: %w", r.stream, r.last, err)
	}
	it, err := cons.Messages(
		jetstream.PullMaxMessages(pullBatch),
		jetstream.PullHeartbeat(r.hb),
		jetstream.WithMessagesErrOnMissingHeartbeat(true),
	)
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.stream, err)
	}
	r.cons, r.it, r.delivered = cons, it, 0
	return nil
}

// next returns the next message and its metadata.
//
// With wait > 0 it returns errIdle when wait passes without a message while
// the connection stayed up: wait must exceed two heartbeats, so a heartbeat
// must have arrived within the last two (the iterator reports a missed one
// after two, and that makes a new consumer). Other errors are the context's
// or terminal (the connection is closed for good).
func (r *orderedReader) next(ctx context.Context, wait time.Duration) (jetstream.Msg, *jetstream.MsgMetadata, error) {
	backoff, timeout := minBackoff, createTimeout
	for {
		if r.it == nil {
			if err := r.open(ctx, timeout); err != nil {
				if ctx.Err() != nil {
					return nil, nil, ctx.Err()
				}
				if r.closedConn(err) || errors.Is(err, errStreamReplaced) {
					return nil, nil, err
				}
				r.log.Warn("projector: cannot create consumer, retrying", "stream", r.stream, "after_seq", r.last, "backoff", backoff, "err", err)
				if err := sleep(ctx, backoff); err != nil {
					return nil, nil, err
				}
				backoff = min(2*backoff, maxBackoff)
				timeout = min(2*timeout, maxCreateTimeout)
				continue
			}
		}
		var reconnects uint64
		if wait > 0 {
			reconnects = r.js.Conn().Stats().Reconnects
		}
		msg, err := r.nextMsg(ctx, wait)
		if err == nil {
			meta, merr := msg.Metadata()
			switch {
			case merr != nil:
				err = fmt.Errorf("message metadata: %w", merr)
			case meta.Sequence.Consumer != r.delivered+1:
				// A message was lost between server and client (or the
				// consumer was re-created under us): start again from what
				// was applied rather than skip anything.
				err = fmt.Errorf("consumer sequence %d after %d", meta.Sequence.Consumer, r.delivered)
			default:
				r.delivered = meta.Sequence.Consumer
				r.last = meta.Sequence.Stream
				r.lastSubject, r.lastAt = msg.Subject(), meta.Timestamp
				return msg, meta, nil
			}
		}
		switch {
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		case wait > 0 && errors.Is(err, context.DeadlineExceeded):
			// While disconnected the iterator does not watch heartbeats, so
			// a quiet wait proves the stream alive only if the connection
			// was up all along.
			conn := r.js.Conn()
			if conn.IsConnected() && conn.Stats().Reconnects == reconnects {
				return nil, nil, errIdle
			}
			continue
		case r.closedConn(err):
			return nil, nil, err
		}
		r.resets++
		r.log.Warn("projector: consumer failed, resuming after last sequence", "stream", r.stream, "after_seq", r.last, "err", err)
		r.close()
	}
}

func (r *orderedReader) nextMsg(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	if wait <= 0 {
		return r.it.Next(jetstream.NextContext(ctx))
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return r.it.Next(jetstream.NextContext(wctx))
}

// close stops the iterator; the server removes its consumer after
// consumerInactive.
func (r *orderedReader) close() {
	if r.it == nil {
		return
	}
	r.it.Stop()
	r.it, r.cons = nil, nil
}

// closedConn reports a failure no retry can cure: a closed connection never
// reopens. Everything else, even "stream not found" (a cluster recovering
// its streams can say that for a moment), is retried.
func (r *orderedReader) closedConn(err error) bool {
	return r.js.Conn().IsClosed() || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, jetstream.ErrConnectionClosed)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
