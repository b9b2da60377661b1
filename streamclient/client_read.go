package streamclient

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

	"github.com/cronstream/cronstream/contract"
)

// maxSeen bounds the states a Client remembers.
const maxSeen = 4096

// scanInactive lets the server remove a reader's consumer once the reader
// is done with it: readers never delete consumers, so a role needs no
// permission to delete (one it could not limit to its own consumers).
const scanInactive = 5 * time.Second

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

// state is an entry as the last read of its history saw it.
type state struct {
	// rev is the entry's revision: the sequence of the config stream's last
	// message under Names.EntryRevisionFilter, 0 when none. Writes expect
	// it.
	rev uint64
	// base is the sequence of the message that set entry (its last config
	// event, or a fail-pause request applied after it), and failPause
	// says which. It is below rev when messages that changed nothing came
	// after it: refused fail-pause requests, NATS server replies.
	base      uint64
	failPause bool
	time      time.Time // when the stream stored the message at base
	ev        *contract.Event
	entry     *contract.Entry // nil when there is no event or it is bad
	canon     []byte          // entry's JSON as json.Marshal writes it (it is normalized)
	err       error           // why the last event is bad
}

// live reports whether the entry exists and is not removed: it has a
// state, or a last event that cannot be applied.
func (s state) hasLive() bool { return s.err != nil || s.entry != nil && !s.entry.Removed }

// live returns the entry if it exists, is not removed and is applicable.
func (s state) live(id string) (contract.Entry, error) {
	switch {
	case s.err != nil:
		return contract.Entry{}, fmt.Errorf("entry %q at revision %d: %w", id, s.base, s.err)
	case !s.hasLive():
		return contract.Entry{}, fmt.Errorf("entry %q: %w", id, ErrNotFound)
	}
	return s.entry.Clone(), nil
}

// current is the entry as List and Lookup show it.
func (s state) current(id string) Current {
	cur := Current{ID: id, Revision: s.rev, Time: s.time, Err: s.err, FailPause: s.failPause, StateRevision: s.base}
	if s.ev != nil {
		cur.Type = s.ev.Type
	}
	if s.entry != nil {
		cur.Entry = *s.entry
	}
	return cur
}

// read returns the state of entry id: from the leader when fresh;
// otherwise the state this client remembers or, failing that, from
// whichever replica answers a Direct Get first (from the leader when the
// stream does not allow direct reads). Only fresh reads are current.
//
// One read of the entry's last message decides, when that message is a
// config event: config events carry the full state. Otherwise (a
// fail-pause request, a NATS server's reply stored there) the entry's
// history is folded up to it.
func (c *Client) read(ctx context.Context, id string, fresh bool) (state, error) {
	if !fresh {
		if cur, ok := c.seen.get(id); ok {
			return cur, nil
		}
	}
	var cur state
	var last *storedMsg
	filter := c.names.EntryRevisionFilter(id)
	err := c.retry(ctx, "read entry "+id, func(actx context.Context) (bool, error) {
		var err error
		if !fresh {
			last, err = c.readDirect(actx, filter)
			if !errors.Is(err, nats.ErrNoResponders) {
				return isTransient(err), err
			}
		}
		last, err = c.readRaw(actx, filter)
		return isTransient(err), err
	})
	switch {
	case err != nil:
		return state{}, err
	case last == nil:
	case last.Subject == c.names.ConfigSubject(id) && !contract.IsServerWritten(last.Header, last.Data):
		cur = c.decodeState(last.Subject, last.Sequence, last.Time, last.Data)
	default:
		if cur, err = c.foldEntry(ctx, id, last.Sequence); err != nil {
			return state{}, err
		}
	}
	c.seen.put(id, cur)
	return cur, nil
}

// readDirect is one Direct Get of the last message under filter, nil when
// there is none. Without AllowDirect on the stream nobody answers:
// nats.ErrNoResponders. Only the message id of the headers is kept: the
// others are the server's, describing the answer.
func (c *Client) readDirect(ctx context.Context, filter string) (*storedMsg, error) {
	body, err := json.Marshal(msgGetRequest{LastFor: filter})
	if err != nil {
		return nil, err
	}
	resp, err := c.js.Conn().RequestWithContext(ctx, c.apiPrefix+"DIRECT.GET."+c.names.ConfigStream(), body)
	if err != nil {
		return nil, err
	}
	if status := resp.Header.Get("Status"); status != "" && len(resp.Data) == 0 {
		if status == "404" {
			return nil, nil
		}
		return nil, fmt.Errorf("direct get %s: status %s %s", filter, status, resp.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(resp.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("direct get %s: bad sequence header: %w", filter, err)
	}
	at, err := time.Parse(time.RFC3339Nano, resp.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("direct get %s: bad time header: %w", filter, err)
	}
	m := &storedMsg{Subject: resp.Header.Get(jetstream.SubjectHeader), Sequence: seq, Time: at, Data: resp.Data, Header: nats.Header{}}
	if id := resp.Header.Get(jetstream.MsgIDHeader); id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	return m, nil
}

// readRaw is one leader read of the last message under filter, nil when
// there is none.
func (c *Client) readRaw(ctx context.Context, filter string) (*storedMsg, error) {
	m, err := c.msgGet(ctx, msgGetRequest{LastFor: filter})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	return m, err
}

// decodeState is the state a config event of the entry sets.
func (c *Client) decodeState(subject string, seq uint64, at time.Time, data []byte) state {
	s := state{rev: seq, base: seq, time: at}
	ev, e, err := contract.DecodeConfigEvent(data)
	s.ev = ev
	if err == nil {
		if id, ok := c.names.EntryFromConfigSubject(subject); !ok || id != e.ID {
			err = fmt.Errorf("%w: event for entry %q on subject %s", contract.ErrMalformedEvent, e.ID, subject)
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

// foldEntry folds the history of entry id up to its message at last (its
// revision), through an ordered consumer.
func (c *Client) foldEntry(ctx context.Context, id string, last uint64) (state, error) {
	f := entryFold{c: c, id: id}
	err := c.scanTo(ctx, c.names.EntrySubjects(id), jetstream.DeliverAllPolicy, last, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		f.apply(m.Subject(), md.Sequence.Stream, md.Timestamp, m.Headers(), m.Data())
	})
	if err != nil {
		return state{}, fmt.Errorf("history of entry %q: %w", id, err)
	}
	f.st.rev = max(f.st.rev, last)
	return f.st, nil
}

// entryFold folds one entry's history in stream order: a config event
// sets the entry's full state, a fail-pause request pauses it when it
// holds (DecodeFailPause, FailPauseRequest.Check), and a NATS server's
// reply stored on its subjects changes nothing (IsServerWritten).
type entryFold struct {
	c  *Client
	id string
	st state
}

// apply folds one message and returns its record; Record.Refused says
// when it changed nothing.
func (f *entryFold) apply(subject string, seq uint64, at time.Time, header nats.Header, data []byte) Record {
	f.st.rev = seq
	_, failPause, _ := f.c.names.EntryFromHistorySubject(subject)
	if contract.IsServerWritten(header, data) {
		return Record{Seq: seq, Time: at, Refused: errors.New(contract.ServerWrittenReason(subject))}
	}
	if !failPause {
		f.st = f.c.decodeState(subject, seq, at, data)
		return Record{Seq: seq, Time: at, Event: f.st.ev, Entry: f.st.entry, Err: f.st.err}
	}
	req, err := contract.DecodeFailPause(f.c.names, f.id, header, data)
	if err == nil {
		var base *contract.Entry
		if !f.st.failPause && f.st.err == nil {
			base = f.st.entry
		}
		err = req.Check(base, f.st.base)
	}
	if err != nil {
		ev, _ := contract.DecodeEvent(data)
		return Record{Seq: seq, Time: at, Event: ev, FailPause: true, Refused: err}
	}
	canon, err := json.Marshal(req.Entry)
	if err != nil {
		return Record{Seq: seq, Time: at, Event: req.Event, FailPause: true, Refused: err}
	}
	f.st = state{rev: seq, base: seq, failPause: true, time: at, ev: req.Event, entry: req.Entry, canon: canon}
	return Record{Seq: seq, Time: at, Event: req.Event, Entry: req.Entry, FailPause: true}
}

// List returns every live entry, sorted by id, as of the moment it starts
// (entries changed while it runs may show their newer state). Entries
// whose last event cannot be applied are included with Err set; removed
// entries are not.
func (c *Client) List(ctx context.Context) ([]Current, error) {
	type lasts struct{ config, failPause *storedMsg }
	byID := map[string]*lasts{}
	err := c.scan(ctx, c.names.ConfigStreamSubjects(), jetstream.DeliverLastPerSubjectPolicy, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		id, failPause, ok := c.names.EntryFromHistorySubject(m.Subject())
		if !ok {
			// A subject with more tokens than an entry id: no entry of ours.
			return
		}
		l := byID[id]
		if l == nil {
			l = &lasts{}
			byID[id] = l
		}
		sm := &storedMsg{Subject: m.Subject(), Sequence: md.Sequence.Stream, Header: m.Headers(), Data: m.Data(), Time: md.Timestamp}
		if failPause {
			l.failPause = sm
		} else {
			l.config = sm
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list entries: %w", err)
	}
	out := make([]Current, 0, len(byID))
	for id, l := range byID {
		s, err := c.listed(ctx, id, l.config, l.failPause)
		if err != nil {
			return nil, fmt.Errorf("list entries: %w", err)
		}
		if !s.hasLive() {
			continue
		}
		out = append(out, s.current(id))
	}
	slices.SortFunc(out, func(a, b Current) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// listed is the state of entry id from the last messages on its config
// and fail-pause subjects. Those decide when the config event is the last,
// or is followed at once by a fail-pause request (it expects the config
// event's revision, and the server guarantees nothing came between);
// otherwise the entry's history is folded.
func (c *Client) listed(ctx context.Context, id string, config, failPause *storedMsg) (state, error) {
	last := config
	if last == nil || failPause != nil && failPause.Sequence > last.Sequence {
		last = failPause
	}
	if config == nil || contract.IsServerWritten(config.Header, config.Data) {
		return c.foldEntry(ctx, id, last.Sequence)
	}
	s := c.decodeState(config.Subject, config.Sequence, config.Time, config.Data)
	if last == config {
		return s, nil
	}
	if req, err := contract.DecodeFailPause(c.names, id, failPause.Header, failPause.Data); err != nil || req.Expected != config.Sequence {
		return c.foldEntry(ctx, id, last.Sequence)
	}
	f := entryFold{c: c, id: id, st: s}
	f.apply(failPause.Subject, failPause.Sequence, failPause.Time, failPause.Header, failPause.Data)
	return f.st, nil
}

// History returns the history of entry id that made its states, oldest
// first: every config event, including those that cannot be applied (with
// Err set), and every fail-pause request that paused it (FailPause set).
// Messages that changed nothing are left out (HistoryAll has them).
// ErrNotFound when the entry has no events at all.
func (c *Client) History(ctx context.Context, id string) ([]Record, error) {
	recs, err := c.HistoryAll(ctx, id)
	if err != nil {
		return nil, err
	}
	recs = slices.DeleteFunc(recs, func(r Record) bool { return r.Refused != nil })
	if len(recs) == 0 {
		return nil, fmt.Errorf("entry %q: %w", id, ErrNotFound)
	}
	return recs, nil
}

// HistoryAll is History with the messages that changed nothing: fail-pause
// requests that were refused and NATS server replies stored on the
// entry's subjects, each with Refused saying why.
func (c *Client) HistoryAll(ctx context.Context, id string) ([]Record, error) {
	if err := contract.ValidateID(id); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	f := entryFold{c: c, id: id}
	var out []Record
	err := c.scan(ctx, c.names.EntrySubjects(id), jetstream.DeliverAllPolicy, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		out = append(out, f.apply(m.Subject(), md.Sequence.Stream, md.Timestamp, m.Headers(), m.Data()))
	})
	if err != nil {
		return nil, fmt.Errorf("history of entry %q: %w", id, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("entry %q: %w", id, ErrNotFound)
	}
	return out, nil
}

// scan delivers the messages of the config stream on subjects under
// policy, up to the last one stored when it starts.
func (c *Client) scan(ctx context.Context, subjects []string, policy jetstream.DeliverPolicy, each func(jetstream.Msg, *jetstream.MsgMetadata)) error {
	var last uint64
	for _, s := range subjects {
		var m *storedMsg
		err := c.retry(ctx, "find last message on "+s, func(actx context.Context) (bool, error) {
			var err error
			m, err = c.readRaw(actx, s)
			return isTransient(err), err
		})
		if err != nil {
			return err
		}
		if m != nil {
			last = max(last, m.Sequence)
		}
	}
	return c.scanTo(ctx, subjects, policy, last, each)
}

// scanTo delivers the messages of the config stream on subjects under
// policy, up to the one at sequence last (or the last one before it),
// through an ordered consumer (which detects gaps and recreates itself).
// The consumer is stopped before scanTo returns, and the server removes it
// after scanInactive.
func (c *Client) scanTo(ctx context.Context, subjects []string, policy jetstream.DeliverPolicy, last uint64, each func(jetstream.Msg, *jetstream.MsgMetadata)) error {
	if last == 0 {
		return nil
	}
	stream := c.names.ConfigStream()
	cons, err := c.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    subjects,
		DeliverPolicy:     policy,
		InactiveThreshold: scanInactive,
	})
	if err != nil {
		return fmt.Errorf("consumer on %s: %w", stream, err)
	}
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 && !c.pendingSoon(ctx, cons) {
		// Nothing on these subjects (last is another subject's message,
		// one a server wrote into the stream): no message would come.
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consume %s: %w", stream, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if md.Sequence.Stream > last {
			return nil
		}
		each(m, md)
		if md.Sequence.Stream >= last || md.NumPending == 0 {
			return nil
		}
	}
}

// pendingSoon reports whether a consumer that found nothing pending when
// it was made finds something within a short while. On a replicated
// stream the consumer may sit on a follower that has not yet applied what
// the leader (where last was read) holds: "nothing pending" then only
// means "not yet".
func (c *Client) pendingSoon(ctx context.Context, cons jetstream.Consumer) bool {
	deadline := time.Now().Add(pendingWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if info, err := cons.Info(ctx); err == nil && info.NumPending > 0 {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// pendingWait bounds how long a scan waits for a follower to catch up
// with a message the leader holds.
const pendingWait = 2 * time.Second

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
