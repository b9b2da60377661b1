package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// maxSeen bounds the states a Client remembers.
const maxSeen = 4096

// stateCache remembers the last state a client saw of each entry, so a
// write can skip its read. A state that is no longer current costs one
// conflict and a fresh read; a result decided without publishing is always
// confirmed by a fresh read (see Client.write).
type stateCache struct {
	mu sync.Mutex
	m  map[string]state
}

func (sc *stateCache) get(id string) (state, bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	s, ok := sc.m[id]
	return s, ok
}

func (sc *stateCache) put(id string, s state) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m == nil {
		sc.m = make(map[string]state)
	}
	if _, ok := sc.m[id]; !ok && len(sc.m) >= maxSeen {
		for k := range sc.m { // forget an arbitrary one
			delete(sc.m, k)
			break
		}
	}
	sc.m[id] = s
}

func (sc *stateCache) drop(id string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	delete(sc.m, id)
}

// state is an entry's subject as the last read saw it.
type state struct {
	rev   uint64 // last sequence on the subject, 0 when none
	time  time.Time
	ev    *Event
	entry *Entry // nil when there is no event or it is bad
	canon []byte // entry's JSON as json.Marshal writes it (it is normalized)
	err   error  // why the last event is bad
}

func (s state) exists() bool  { return s.rev != 0 }
func (s state) removed() bool { return s.entry != nil && s.entry.Removed }

// live returns the entry if it exists, is not removed and is applicable.
func (s state) live(id string) (Entry, error) {
	switch {
	case !s.exists() || s.removed():
		return Entry{}, fmt.Errorf("entry %q: %w", id, ErrNotFound)
	case s.err != nil:
		return Entry{}, fmt.Errorf("entry %q at revision %d: %w", id, s.rev, s.err)
	}
	return s.entry.Clone(), nil
}

// read returns the state of entry id: from the leader when fresh;
// otherwise the state this client remembers or, failing that, from
// whichever replica answers a Direct Get first (from the leader when the
// stream does not allow direct reads). Only fresh reads are current.
func (c *Client) read(ctx context.Context, id string, fresh bool) (state, error) {
	if !fresh {
		if cur, ok := c.seen.get(id); ok {
			return cur, nil
		}
	}
	var cur state
	subject := c.names.ConfigSubject(id)
	err := c.retry(ctx, "read entry "+id, func(actx context.Context) (bool, error) {
		var err error
		if !fresh {
			cur, err = c.readDirect(actx, subject)
			if !errors.Is(err, nats.ErrNoResponders) {
				return isTransient(err), err
			}
		}
		cur, err = c.readRaw(actx, subject)
		return isTransient(err), err
	})
	if err == nil {
		c.seen.put(id, cur)
	}
	return cur, err
}

// readDirect is one Direct Get of a subject's last message. Without
// AllowDirect on the stream nobody answers: nats.ErrNoResponders.
func (c *Client) readDirect(ctx context.Context, subject string) (state, error) {
	resp, err := c.js.Conn().RequestWithContext(ctx, c.apiPrefix+"DIRECT.GET."+c.names.ConfigStream()+"."+subject, nil)
	if err != nil {
		return state{}, err
	}
	if status := resp.Header.Get("Status"); status != "" && len(resp.Data) == 0 {
		if status == "404" {
			return state{}, nil
		}
		return state{}, fmt.Errorf("direct get %s: status %s %s", subject, status, resp.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(resp.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return state{}, fmt.Errorf("direct get %s: bad sequence header: %w", subject, err)
	}
	at, err := time.Parse(time.RFC3339Nano, resp.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return state{}, fmt.Errorf("direct get %s: bad time header: %w", subject, err)
	}
	return c.decodeState(resp.Header.Get(jetstream.SubjectHeader), seq, at, resp.Data), nil
}

// readRaw is one leader read of a subject's last message.
func (c *Client) readRaw(ctx context.Context, subject string) (state, error) {
	m, err := c.msgGet(ctx, msgGetRequest{LastFor: subject})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return state{}, nil
	}
	if err != nil {
		return state{}, err
	}
	return c.decodeState(m.Subject, m.Sequence, m.Time, m.Data), nil
}

func (c *Client) decodeState(subject string, seq uint64, at time.Time, data []byte) state {
	s := state{rev: seq, time: at}
	ev, e, err := DecodeConfigEvent(data)
	s.ev = ev
	if err == nil {
		if id, ok := c.names.EntryFromConfigSubject(subject); !ok || id != e.ID {
			err = fmt.Errorf("%w: event for entry %q on subject %s", ErrMalformedEvent, e.ID, subject)
		}
	}
	if err == nil {
		s.canon, err = json.Marshal(e)
	}
	if err != nil {
		s.err = err
		return s
	}
	s.entry = e
	return s
}

// DecodeConfigEvent decodes a config event and the entry state it
// carries, normalized. The event is returned whenever the envelope decodes,
// so audit can show a bad event as it is; the error (wrapping
// ErrMalformedEvent, and ErrInvalidEntry when the state fails validation)
// says why the state cannot be applied: an unknown type, data that does not
// decode or validate, an id that is not the event's subject (when it has
// one), or a type that contradicts the state (removed, paused, resumed).
// The caller checks that the id matches the NATS subject the event was
// stored on.
func DecodeConfigEvent(b []byte) (*Event, *Entry, error) {
	e := new(Entry)
	ev, err := DecodeConfigEventInto(b, e)
	if err != nil {
		return ev, nil, err
	}
	return ev, e, nil
}

// DecodeConfigEventInto is DecodeConfigEvent decoding the entry into *e,
// for a caller that keeps it inside a value of its own (the projector's
// State) and so pays one allocation for both. *e is overwritten; after an
// error it holds nothing of use.
func DecodeConfigEventInto(b []byte, e *Entry) (*Event, error) {
	*e = Entry{}
	// The form cronstream writes takes the fast path; anything else, and
	// every error, is decided by encoding/json (see decodeConfigFast).
	ev, fast := decodeConfigFast(b, e)
	var err error
	if fast {
		err = ev.check()
	} else {
		ev, err = DecodeEvent(b)
	}
	if err != nil {
		return nil, err
	}
	if !IsConfigType(ev.Type) {
		return ev, fmt.Errorf("%w: event %s has unknown config event type %q", ErrMalformedEvent, ev.ID, ev.Type)
	}
	if gated := IsGatedType(ev.Type); gated || !fast {
		// A gated event must hold only fields this build knows: one it
		// does not is a later build's schedule field that it cannot apply.
		*e = Entry{}
		if err := ev.decodeData(e, gated); err != nil {
			return ev, err
		}
	}
	// e is ours alone: defaults go in place, with no copy.
	e.normalize()
	// A removal needs only to name its entry: a removed entry never fires,
	// and a removal is how an entry whose state or id is not valid (written
	// by another publisher, say) is cleaned up.
	if ev.Type == TypeEntryRemoved && e.Removed {
		if e.ID == "" {
			return ev, fmt.Errorf("%w: %s event %s without an entry id", ErrMalformedEvent, ev.Type, ev.ID)
		}
	} else if err := e.validateNormalized(); err != nil {
		return ev, fmt.Errorf("%w: %s event %s: %w", ErrMalformedEvent, ev.Type, ev.ID, err)
	}
	kind := ConfigKind(ev.Type)
	switch {
	case ev.Subject != "" && ev.Subject != e.ID:
		return ev, fmt.Errorf("%w: %s event %s: event subject %q does not match entry id %q", ErrMalformedEvent, ev.Type, ev.ID, ev.Subject, e.ID)
	case kind == TypeEntryRemoved && !e.Removed:
		return ev, fmt.Errorf("%w: %s event %s without removed=true", ErrMalformedEvent, ev.Type, ev.ID)
	case kind != TypeEntryRemoved && e.Removed:
		return ev, fmt.Errorf("%w: %s event %s with removed=true", ErrMalformedEvent, ev.Type, ev.ID)
	case kind == TypeEntryPaused && !e.Paused, kind == TypeEntryResumed && e.Paused:
		return ev, fmt.Errorf("%w: %s event %s with paused=%t", ErrMalformedEvent, ev.Type, ev.ID, e.Paused)
	}
	return ev, nil
}

// List returns every live entry, sorted by id, as of the moment it starts
// (entries changed while it runs may show their newer state). Entries
// whose last event cannot be applied are included with Err set; removed
// entries are not.
func (c *Client) List(ctx context.Context) ([]Current, error) {
	byID := map[string]Current{}
	err := c.scan(ctx, c.names.ConfigFilter(), jetstream.DeliverLastPerSubjectPolicy, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		id, ok := c.names.EntryFromConfigSubject(m.Subject())
		if !ok {
			// A subject with more tokens than an entry id: no entry of ours.
			return
		}
		s := c.decodeState(m.Subject(), md.Sequence.Stream, md.Timestamp, m.Data())
		cur := Current{ID: id, Revision: s.rev, Time: s.time, Err: s.err}
		if s.ev != nil {
			cur.Type = s.ev.Type
		}
		if s.entry != nil {
			if s.entry.Removed {
				delete(byID, id)
				return
			}
			cur.Entry = *s.entry
		}
		byID[id] = cur
	})
	if err != nil {
		return nil, fmt.Errorf("list entries: %w", err)
	}
	out := make([]Current, 0, len(byID))
	for _, cur := range byID {
		out = append(out, cur)
	}
	slices.SortFunc(out, func(a, b Current) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// History returns every config event of entry id, oldest first, including
// those that cannot be applied (with Err set). ErrNotFound when the entry
// has no events at all.
func (c *Client) History(ctx context.Context, id string) ([]Record, error) {
	if err := ValidateID(id); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	subject := c.names.ConfigSubject(id)
	var out []Record
	err := c.scan(ctx, subject, jetstream.DeliverAllPolicy, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		s := c.decodeState(m.Subject(), md.Sequence.Stream, md.Timestamp, m.Data())
		out = append(out, Record{Seq: s.rev, Time: s.time, Event: s.ev, Entry: s.entry, Err: s.err})
	})
	if err != nil {
		return nil, fmt.Errorf("history of entry %q: %w", id, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("entry %q: %w", id, ErrNotFound)
	}
	return out, nil
}

// scan delivers the messages of the config stream matching filter under
// policy, up to the last one stored when it starts, through an ordered
// consumer (which detects gaps and recreates itself). The consumer is
// stopped and deleted before scan returns.
func (c *Client) scan(ctx context.Context, filter string, policy jetstream.DeliverPolicy, each func(jetstream.Msg, *jetstream.MsgMetadata)) error {
	var last uint64
	err := c.retry(ctx, "find last message on "+filter, func(actx context.Context) (bool, error) {
		m, err := c.msgGet(actx, msgGetRequest{LastFor: filter})
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			last = 0
			return false, nil
		case err != nil:
			return isTransient(err), err
		}
		last = m.Sequence
		return false, nil
	})
	if err != nil || last == 0 {
		return err
	}
	stream := c.names.ConfigStream()
	cons, err := c.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{filter},
		DeliverPolicy:     policy,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("consumer on %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consume %s: %w", stream, err)
	}
	defer func() {
		it.Stop()
		// The server would drop the consumer after its inactive threshold;
		// deleting it now keeps `consumer ls` clean.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attemptTimeout)
			_ = c.js.DeleteConsumer(dctx, stream, info.Name)
			cancel()
		}
	}()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		each(m, md)
		if md.Sequence.Stream >= last || md.NumPending == 0 {
			return nil
		}
	}
}

// msgGetRequest is the JetStream STREAM.MSG.GET request.
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

type storedMsg struct {
	Subject  string
	Sequence uint64
	Header   nats.Header
	Data     []byte
	Time     time.Time
}

// msgGet reads one message of the config stream from the stream leader
// (the STREAM.MSG.GET API, answered only by the leader, unlike Direct Get).
func (c *Client) msgGet(ctx context.Context, req msgGetRequest) (*storedMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	subj := c.apiPrefix + "STREAM.MSG.GET." + c.names.ConfigStream()
	resp, err := c.js.Conn().RequestWithContext(ctx, subj, body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs,omitempty"`
			Data     []byte    `json:"data,omitempty"`
			Time     time.Time `json:"time"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("decode message get response: %w", err)
	}
	if r.Error != nil {
		if r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		if r.Error.ErrorCode == jetstream.JSErrCodeStreamNotFound {
			return nil, fmt.Errorf("config stream %s does not exist (create it with EnsureStreams): %w", c.names.ConfigStream(), jetstream.ErrStreamNotFound)
		}
		return nil, r.Error
	}
	if r.Message == nil {
		return nil, fmt.Errorf("message get on %s: answer has neither message nor error", c.names.ConfigStream())
	}
	m := &storedMsg{Subject: r.Message.Subject, Sequence: r.Message.Sequence, Data: r.Message.Data, Time: r.Message.Time}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("decode message headers: %w", err)
		}
	}
	return m, nil
}
