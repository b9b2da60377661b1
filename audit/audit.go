package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// ErrInvalidParams is wrapped by Open's error for Params that cannot be read.
var ErrInvalidParams = errors.New("invalid audit params")

// consumerInactive lets the server remove a reader's consumers once it no
// longer reads them: a Reader deletes none (no role may delete consumers:
// it could not be limited to its own).
const consumerInactive = 10 * time.Second

// ErrClosed is what Next returns once the Reader is closed.
var ErrClosed = errors.New("audit reader closed")

// Params say what a Reader returns. The zero value reads every event of
// both streams under the default prefix, once. Filters combine: a record is
// returned when it passes all of them.
type Params struct {
	// Names are the streams' names (zero value: the default prefix).
	Names events.Names
	// Entry keeps the config events of one entry and its fired and skipped
	// events.
	Entry string
	// Queue keeps the recoveries in an asynq queue, the fires into it, and
	// the config events and skips of entries that are in it (or just left
	// it). The config stream is then read from its start whatever Since
	// says, to know each entry's queue at Since.
	Queue string
	// Selector keeps the config, fired and skipped events of entries whose
	// labels match it (events.ParseSelector): a config event when the
	// entry matched before or after it, so the change that takes an entry
	// out of the selector shows. Recoveries name a queue, not an entry, and
	// are left out. The config stream is then read from its start whatever
	// Since says, to know each entry's labels at Since.
	Selector events.Selector
	// Types keeps the events whose type matches one of these patterns (see
	// MatchType and CheckType); empty keeps every type. A message that is
	// not a CloudEvent matches none.
	Types []string
	// Since and Until keep the events the streams stored at or after Since
	// and at or before Until; zero leaves that side open. Until cannot be
	// combined with Follow.
	Since, Until time.Time
	// Limit returns at most the first Limit events (0: no limit), Tail only
	// the last Tail events of the history (0: all of it); one of the two.
	Limit, Tail int
	// Follow goes on, after the history, with what either stream stores
	// next.
	Follow bool
	// Progress, when set, is called from Next as the history is read: after
	// each message (returned or filtered out), with how many of the
	// history's messages are read and how many it had when Open looked, and
	// once more with read == total when the history ends.
	Progress func(read, total uint64)
}

// Record is one stored message of either stream.
type Record struct {
	Stream  string    // the stream's name
	Config  bool      // from the config stream (else the activity stream)
	Seq     uint64    // the stream sequence
	Time    time.Time // when the stream stored it
	Subject string    // the NATS subject it was stored on
	Data    []byte    // the event as stored: a CloudEvent in JSON (one of a batch message's; they share Seq)
	// Event is Data decoded, nil when it is not a CloudEvent; Err then
	// says why (it wraps events.ErrMalformedEvent).
	Event *events.Event
	Err   error
	// Unconfirmed is the message's events.HeaderRedisUnconfirmed: the
	// relay published it before Redis's replicas confirmed its write.
	Unconfirmed string
	// FailPause says the record is a fail-pause request (a replica's pause
	// on failure, on <p>.failpause.<entry>) rather than a config event.
	FailPause bool
	// Refused says why a record of the config stream changed nothing: a
	// fail-pause request that does not hold (events.CheckFailPause), or a
	// NATS server's reply stored on an entry's subject
	// (events.IsServerWritten). Readers of the configuration skip it.
	Refused error
	// more is set on every event of a batch message but the last: the
	// history counts messages.
	more bool
}

// Reader returns the records of both streams in the order the streams
// stored them. Next is for one goroutine at a time; Close may be called
// from another, to end a Next that waits.
type Reader struct {
	p       Params
	js      jetstream.JetStream
	flt     filter
	sources []*source
	closed  context.Context // ends with Close; the sources read on it
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	phase    phase
	tail     []Record // the last Params.Tail records of the history
	returned int
	read     uint64 // history messages read, for Progress
	total    uint64
}

type phase int

const (
	phaseHistory  phase = iota
	phaseTail           // returning the records kept for Params.Tail
	phaseCaughtUp       // the history is read: io.EOF once
	phaseLive
	phaseDone
)

// source reads one stream through an ordered consumer, in a goroutine that
// hands each message to ch.
type source struct {
	// client checks fail-pause requests (config stream only).
	client  *events.Client
	names   events.Names
	config  bool
	stream  string
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	ch      chan Record
	pending uint64  // messages of the history still to read
	head    *Record // the next message of the history, read ahead for the merge
	done    bool    // history read (or Until passed)
}

// Open checks p and starts reading both streams; ctx bounds the opening
// only. The streams must exist.
func Open(ctx context.Context, js jetstream.JetStream, p Params) (*Reader, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	names := p.Names
	cfgSubjects := names.ConfigStreamSubjects()
	actSubjects := []string(nil)
	switch {
	case p.Entry != "":
		cfgSubjects = names.EntrySubjects(p.Entry)
		actSubjects = []string{names.FireSubject(p.Entry)}
	case p.Queue != "":
		actSubjects = []string{names.FireFilter(), names.RecoverySubject(p.Queue)}
	case !p.Selector.Empty():
		actSubjects = []string{names.FireFilter()}
	}
	cfgSince := p.Since
	if p.Queue != "" || !p.Selector.Empty() {
		// Events before Since only feed the entry → queue and entry →
		// labels maps.
		cfgSince = time.Time{}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &Reader{
		p: p, js: js, closed: rctx, cancel: cancel,
		flt: filter{names: names, entry: p.Entry, queue: p.Queue, types: p.Types, since: p.Since, until: p.Until, queueOf: map[string]string{},
			sel: p.Selector, labelsOf: map[string]map[string]string{}},
	}
	for _, spec := range []struct {
		config   bool
		stream   string
		subjects []string
		since    time.Time
	}{
		{true, names.ConfigStream(), cfgSubjects, cfgSince},
		{false, names.ActivityStream(), actSubjects, p.Since},
	} {
		cc := jetstream.OrderedConsumerConfig{FilterSubjects: spec.subjects, InactiveThreshold: consumerInactive}
		if !spec.since.IsZero() {
			t := spec.since
			cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
		}
		cons, err := js.OrderedConsumer(ctx, spec.stream, cc)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("read %s: %w", spec.stream, err)
		}
		src := &source{config: spec.config, stream: spec.stream, cons: cons, ch: make(chan Record, 256), client: events.NewClient(js, names), names: names}
		r.sources = append(r.sources, src)
		if info := cons.CachedInfo(); info != nil {
			src.pending = info.NumPending
		}
		r.total += src.pending
		src.done = src.pending == 0
		if src.done && !p.Follow {
			continue
		}
		if src.it, err = cons.Messages(); err != nil {
			r.Close()
			return nil, fmt.Errorf("read %s: %w", spec.stream, err)
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			src.read(rctx)
		}()
	}
	return r, nil
}

func (p Params) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidParams, fmt.Sprintf(format, args...))
	}
	if p.Entry != "" {
		if err := events.ValidateID(p.Entry); err != nil {
			return fmt.Errorf("%w: entry: %w", ErrInvalidParams, err)
		}
	}
	for _, t := range p.Types {
		if err := CheckType(t); err != nil {
			return fmt.Errorf("%w: type: %w", ErrInvalidParams, err)
		}
	}
	switch {
	case !p.Until.IsZero() && p.Follow:
		return bad("Until and Follow: following never ends at a time")
	case !p.Until.IsZero() && p.Until.Before(p.Since):
		return bad("Until %s is before Since %s", p.Until.Format(time.RFC3339Nano), p.Since.Format(time.RFC3339Nano))
	case p.Limit < 0 || p.Tail < 0:
		return bad("Limit and Tail count events: give a positive number")
	case p.Limit > 0 && p.Tail > 0:
		return bad("Limit and Tail: give one (the first N or the last N)")
	}
	return nil
}

// Next returns the next record. io.EOF says the history (what the streams
// held when Open looked) is read; a Reader without Follow then keeps
// returning io.EOF, one with Follow waits in the following calls for what
// either stream stores next. After Limit records every call returns io.EOF.
// An error of ctx is returned as it is and the Reader stays usable; after
// Close, Next returns ErrClosed.
func (r *Reader) Next(ctx context.Context) (Record, error) {
	for {
		if r.closed.Err() != nil {
			return Record{}, ErrClosed
		}
		if r.p.Limit > 0 && r.returned >= r.p.Limit {
			return Record{}, io.EOF
		}
		switch r.phase {
		case phaseHistory:
			rec, ok, err := r.nextOfHistory(ctx)
			if err != nil {
				return Record{}, err
			}
			if !ok {
				r.phase = phaseTail
				if r.p.Progress != nil {
					r.p.Progress(r.total, r.total)
				}
				continue
			}
			if !r.flt.keep(rec) {
				continue
			}
			if r.p.Tail > 0 {
				if len(r.tail) == r.p.Tail {
					r.tail = append(r.tail[:0], r.tail[1:]...)
				}
				r.tail = append(r.tail, rec)
				continue
			}
			return r.emit(rec)
		case phaseTail:
			if len(r.tail) > 0 {
				rec := r.tail[0]
				r.tail = r.tail[1:]
				return r.emit(rec)
			}
			r.phase = phaseCaughtUp
		case phaseCaughtUp:
			r.phase = phaseDone
			if r.p.Follow {
				r.phase = phaseLive
			}
			return Record{}, io.EOF
		case phaseLive:
			var rec Record
			select {
			case <-ctx.Done():
				return Record{}, ctx.Err()
			case <-r.closed.Done():
				return Record{}, ErrClosed
			case rec = <-r.sources[0].ch:
			case rec = <-r.sources[1].ch:
			}
			if r.flt.keep(rec) {
				return r.emit(rec)
			}
		default:
			return Record{}, io.EOF
		}
	}
}

func (r *Reader) emit(rec Record) (Record, error) {
	r.returned++
	return rec, nil
}

// nextOfHistory returns the history's next message by stream timestamp (a
// two-way merge), or ok false when the history is read.
func (r *Reader) nextOfHistory(ctx context.Context) (rec Record, ok bool, err error) {
	for _, src := range r.sources {
		for !src.done && src.head == nil {
			select {
			case m := <-src.ch:
				if !m.more {
					src.pending--
				}
				if !r.p.Until.IsZero() && m.Time.After(r.p.Until) {
					src.done = true
					break
				}
				src.head = &m
				if src.pending == 0 && !m.more {
					// The last message of the history is this head.
					src.done = true
				}
			case <-ctx.Done():
				return Record{}, false, ctx.Err()
			case <-r.closed.Done():
				return Record{}, false, ErrClosed
			}
		}
	}
	var next *source
	for _, src := range r.sources {
		if src.head != nil && (next == nil || src.head.Time.Before(next.head.Time)) {
			next = src
		}
	}
	if next == nil {
		return Record{}, false, nil
	}
	rec = *next.head
	next.head = nil
	if !rec.more {
		r.read++
	}
	if r.p.Progress != nil {
		r.p.Progress(r.read, r.total)
	}
	return rec, true, nil
}

// Close stops reading. It deletes no consumer (no role may: it could not
// be limited to its own): the server removes each after its inactive
// threshold (consumerInactive). Calls after the first return its error.
func (r *Reader) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		for _, src := range r.sources {
			if src.it != nil {
				src.it.Stop()
			}
		}
		r.wg.Wait()
	})
	return r.closeErr
}

// judge sets what a config-stream record is: a fail-pause request, and
// whether it (or a NATS server's reply stored there) changed nothing.
func (src *source) judge(ctx context.Context, rec *Record, header nats.Header) {
	if events.IsServerWritten(header, rec.Data) {
		rec.Refused = errors.New(events.ServerWrittenReason(rec.Subject))
		return
	}
	if _, failPause, ok := src.names.EntryFromHistorySubject(rec.Subject); ok && failPause {
		rec.FailPause = true
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := src.client.CheckFailPause(cctx, rec.Subject, header, rec.Data); err != nil {
			if !errors.Is(err, events.ErrFailPauseRefused) {
				err = fmt.Errorf("could not be checked: %w", err)
			}
			rec.Refused = err
		}
	}
}

// read hands every message to ch until ctx ends or the iterator stops.
func (src *source) read(ctx context.Context) {
	for {
		m, err := src.it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			continue // the ordered consumer recreates itself after a gap or reconnect
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		// A batch message (the recoverer's) is a record per event.
		parts, splitErr := events.SplitEvents(m.Data())
		if splitErr != nil {
			parts = [][]byte{m.Data()}
		}
		unconfirmed := m.Headers().Get(events.HeaderRedisUnconfirmed)
		for i, p := range parts {
			rec := Record{Stream: src.stream, Config: src.config, Seq: md.Sequence.Stream, Time: md.Timestamp, Subject: m.Subject(), Data: p, more: i < len(parts)-1,
				Unconfirmed: unconfirmed}
			if rec.Event, rec.Err = events.DecodeEvent(p); splitErr != nil {
				rec.Event, rec.Err = nil, splitErr
			}
			if src.config {
				src.judge(ctx, &rec, m.Headers())
			}
			select {
			case src.ch <- rec:
			case <-ctx.Done():
				return
			}
		}
	}
}
