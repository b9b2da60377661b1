package streamclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
)

// DefaultSource is the CloudEvents source of events a Client publishes
// when no WithSource option is given.
const DefaultSource = "cronstream/client"

const (
	// defaultRetryBudget bounds how long a write or read keeps retrying
	// transient answers. A replicated stream elects a new leader within a
	// few seconds (NATS raft election timeouts are 4-9 s), so the budget
	// must outlast one election.
	defaultRetryBudget = 30 * time.Second
	// attemptTimeout bounds one request; a request that times out is
	// retried unchanged.
	attemptTimeout = 5 * time.Second
	// conflictRetries bounds read-modify-write rounds when another writer
	// keeps winning.
	conflictRetries = 10
	firstBackoff    = 20 * time.Millisecond
	maxBackoff      = time.Second
)

// ErrNotFound is returned when an entry does not exist or was removed.
var ErrNotFound = errors.New("entry not found")

// ErrRevisionConflict is matched (errors.Is) by every *ConflictError.
var ErrRevisionConflict = errors.New("revision conflict")

// ConflictError says a write expected an entry at one revision and found
// it at another. Revision 0 means "no live entry".
type ConflictError struct {
	Entry    string
	Expected uint64
	Current  uint64
}

func (e *ConflictError) Error() string {
	want := fmt.Sprintf("revision %d", e.Expected)
	if e.Expected == 0 {
		want = "no live entry (revision 0)"
	}
	return fmt.Sprintf("entry %q: revision conflict: expected %s, current revision is %d", e.Entry, want, e.Current)
}

// Is makes errors.Is(err, ErrRevisionConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrRevisionConflict }

// Client publishes config changes to <P>_CONFIG with per-entry optimistic
// concurrency and reads entries back. It is safe for concurrent use.
//
// Reads come in two kinds. The read before a write is allowed to be
// stale: it uses the state this client last saw of the entry (its own last
// write or read) or, for an entry it has not seen, a Direct Get, which any
// replica may answer — a follower may not yet have applied the latest
// write. That is harmless when the write publishes: the server checks the
// expected revision, a stale state becomes a conflict, and the client reads
// again from the leader. Whenever the read alone decides the outcome
// (nothing to change, not found, an IfRevision mismatch) and whenever Get
// answers, the read goes to the stream leader through the message-get API,
// so a client always sees its own and everybody's completed writes.
//
// A write whose context ends, or whose retries run out, while its outcome
// is unknown returns an error although the event may have been stored;
// read the entry again to know.
type Client struct {
	js     jetstream.JetStream
	names  contract.Names
	source string
	now    func() time.Time
	budget time.Duration
	// apiPrefix is the JetStream API prefix of js ($JS.API. unless js was
	// made with a domain or prefix).
	apiPrefix string
	seen      stateCache
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithSource sets the CloudEvents source of published events, e.g.
// "cronstream/cli/alice" (default "cronstream/client").
func WithSource(source string) ClientOption {
	return func(c *Client) {
		if source != "" {
			c.source = source
		}
	}
}

// WithClock sets the clock that stamps event times (tests).
func WithClock(now func() time.Time) ClientOption {
	return func(c *Client) {
		if now != nil {
			c.now = now
		}
	}
}

// WithRetryBudget bounds how long one call keeps retrying transient
// answers (timeouts, leader elections, a publish still in process) before
// it gives up (default 30s). The context's deadline bounds it too.
func WithRetryBudget(d time.Duration) ClientOption {
	return func(c *Client) {
		if d > 0 {
			c.budget = d
		}
	}
}

// NewClient returns a client for the config stream named by names.
func NewClient(js jetstream.JetStream, names contract.Names, opts ...ClientOption) *Client {
	c := &Client{js: js, names: names, source: DefaultSource, now: time.Now, budget: defaultRetryBudget}
	for _, o := range opts {
		o(c)
	}
	jo := js.Options()
	switch {
	case jo.APIPrefix != "":
		c.apiPrefix = strings.TrimSuffix(jo.APIPrefix, ".") + "."
	case jo.Domain != "":
		c.apiPrefix = "$JS." + jo.Domain + ".API."
	default:
		c.apiPrefix = jetstream.DefaultAPIPrefix
	}
	return c
}

// WriteOption modifies one write.
type WriteOption func(*writeOptions)

type writeOptions struct {
	rev    uint64
	hasRev bool
}

// IfRevision makes a write conditional: it succeeds only if the entry's
// current revision is rev, and otherwise returns a *ConflictError carrying
// the current revision, without retrying. IfRevision(0) means "only if
// there is no live entry": the entry never existed or was removed.
//
// Without IfRevision a write is read-modify-write: it applies the change
// to the state it just read and, when another writer got in between, reads
// again and recomputes, a bounded number of times.
func IfRevision(rev uint64) WriteOption {
	return func(o *writeOptions) { o.rev, o.hasRev = rev, true }
}

// Result is the outcome of a write.
type Result struct {
	// Revision is the entry's revision after the write: the new event's
	// stream sequence, or the current revision when nothing changed.
	Revision uint64
	// Type is the event type published, "" when nothing changed.
	Type string
	// Entry is the state after the write.
	Entry contract.Entry
}

// Current is one entry as List sees it.
type Current struct {
	ID       string
	Revision uint64
	Time     time.Time      // when the revision was stored
	Type     string         // the last event's type ("" if the envelope is bad)
	Entry    contract.Entry // zero when Err is set
	// Err is set when the last event of the entry does not decode or
	// validate: replicas quarantine such an entry until a valid event
	// arrives. It wraps ErrMalformedEvent.
	Err error
	// FailPause says the entry's state was set by a fail-pause request
	// (a replica paused it on failure), not by a config event, and
	// StateRevision is the sequence of the message that set it (Revision
	// is the entry's last message: it may be a later one that changed
	// nothing).
	FailPause     bool
	StateRevision uint64
}

// Record is one message of an entry's history: a config event, or a
// fail-pause request.
type Record struct {
	Seq   uint64          // stream sequence: the entry's revision after this event
	Time  time.Time       // when the stream stored it
	Event *contract.Event // nil when the envelope does not decode
	Entry *contract.Entry // nil when the event cannot be applied
	Err   error           // why Event or Entry is nil; wraps ErrMalformedEvent
	// FailPause says the message is a fail-pause request, on the entry's
	// fail-pause subject: a replica's pause on failure.
	FailPause bool
	// Refused, set only in HistoryAll, says why the message changed
	// nothing: a fail-pause request that does not hold (wrapping
	// ErrFailPauseRefused), or a NATS server's reply stored on the entry's
	// subjects. Entry is nil then.
	Refused error
}

// Put registers or updates an entry with the full state e. It validates e
// first (nothing is published for an invalid entry) and stores it with
// every default written out. The event is registered when the entry does
// not exist or was removed, updated otherwise; when the content is the same
// as the current state nothing is published and the current revision is
// returned. A removed flag in e is ignored: use Remove.
func (c *Client) Put(ctx context.Context, e contract.Entry, opts ...WriteOption) (Result, error) {
	e.Removed = false
	if err := e.Validate(); err != nil {
		return Result{}, fmt.Errorf("put: %w", err)
	}
	want := e.Normalize()
	// The normalized state's JSON is both what the event carries and what
	// "same content" compares: SameContent without encoding twice per put.
	wantJSON, err := json.Marshal(want)
	if err != nil {
		return Result{}, fmt.Errorf("put: encode entry %q: %w", want.ID, err)
	}
	return c.write(ctx, "put", want.ID, opts, func(cur state) (change, error) {
		switch {
		case !cur.hasLive():
			return change{typ: contract.TypeEntryRegistered, next: want, data: wantJSON}, nil
		case cur.entry != nil && bytes.Equal(cur.canon, wantJSON):
			return change{next: cur.entry.Clone()}, nil
		default:
			// Also the way to repair an entry whose last event is bad.
			return change{typ: contract.TypeEntryUpdated, next: want, data: wantJSON}, nil
		}
	})
}

// Remove removes an entry. Its event carries the last state with removed
// set, so history keeps what was removed. An entry whose last event cannot
// be applied, or whose id ValidateID refuses (anything List returns; see
// ValidateListedID), is removed by an event that carries only the id.
// ErrNotFound when the entry does not exist or is already removed.
func (c *Client) Remove(ctx context.Context, id string, opts ...WriteOption) (Result, error) {
	return c.write(ctx, "remove", id, opts, func(cur state) (change, error) {
		if cur.err != nil {
			return change{typ: contract.TypeEntryRemoved, next: contract.Entry{ID: id, Removed: true}}, nil
		}
		e, err := cur.live(id)
		if err != nil {
			return change{}, err
		}
		e.Removed = true
		return change{typ: contract.TypeEntryRemoved, next: e}, nil
	})
}

// Pause stops an entry from firing; note (may be empty) says why and
// replaces any earlier note. Pausing a paused entry with the same note
// changes nothing.
func (c *Client) Pause(ctx context.Context, id, note string, opts ...WriteOption) (Result, error) {
	return c.write(ctx, "pause", id, opts, func(cur state) (change, error) {
		e, err := cur.live(id)
		if err != nil {
			return change{}, err
		}
		if e.Paused && e.Note == note {
			return change{next: e}, nil
		}
		e.Paused, e.Note = true, note
		return change{typ: contract.TypeEntryPaused, next: e}, nil
	})
}

// Resume lets a paused entry fire again and clears its pause note. Resuming
// an entry that is not paused changes nothing.
func (c *Client) Resume(ctx context.Context, id string, opts ...WriteOption) (Result, error) {
	return c.write(ctx, "resume", id, opts, func(cur state) (change, error) {
		e, err := cur.live(id)
		if err != nil {
			return change{}, err
		}
		if !e.Paused {
			return change{next: e}, nil
		}
		e.Paused, e.Note = false, ""
		return change{typ: contract.TypeEntryResumed, next: e}, nil
	})
}

// Get returns an entry and its revision. ErrNotFound when it does not
// exist or was removed; an error wrapping ErrMalformedEvent when its last
// event cannot be applied.
func (c *Client) Get(ctx context.Context, id string) (contract.Entry, uint64, error) {
	if err := contract.ValidateID(id); err != nil {
		return contract.Entry{}, 0, fmt.Errorf("get: %w", err)
	}
	cur, err := c.read(ctx, id, true)
	if err != nil {
		return contract.Entry{}, 0, fmt.Errorf("get entry %q: %w", id, err)
	}
	e, err := cur.live(id)
	if err != nil {
		return contract.Entry{}, 0, err
	}
	return e, cur.rev, nil
}

// Lookup returns entry id as List would, read from the stream leader:
// ErrNotFound when it does not exist or was removed; Err set when its last
// event cannot be applied.
func (c *Client) Lookup(ctx context.Context, id string) (Current, error) {
	if err := contract.ValidateID(id); err != nil {
		return Current{}, fmt.Errorf("lookup: %w", err)
	}
	s, err := c.read(ctx, id, true)
	if err != nil {
		return Current{}, fmt.Errorf("look up entry %q: %w", id, err)
	}
	if !s.hasLive() {
		return Current{}, fmt.Errorf("entry %q: %w", id, ErrNotFound)
	}
	return s.current(id), nil
}

// change is what a write decided: the event type to publish ("" for
// none), the entry state after the change, and optionally that state's
// JSON already encoded.
type change struct {
	typ  string
	next contract.Entry
	data []byte
}

// decide computes a change from the current state.
type decide func(cur state) (change, error)

// write is the read-modify-write loop shared by every change.
func (c *Client) write(ctx context.Context, op, id string, opts []WriteOption, decide decide) (Result, error) {
	var wo writeOptions
	for _, o := range opts {
		o(&wo)
	}
	validID := contract.ValidateID
	if op == "remove" {
		validID = contract.ValidateListedID
	}
	if err := validID(id); err != nil {
		return Result{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := contract.CheckSource(c.source); err != nil {
		return Result{}, fmt.Errorf("%s: %w", op, err)
	}
	subject := c.names.ConfigSubject(id)
	fresh := false // whether the next read must come from the leader
	for round := 0; ; {
		cur, err := c.read(ctx, id, fresh)
		if err != nil {
			return Result{}, fmt.Errorf("%s entry %q: %w", op, id, err)
		}
		var outcome error
		if wo.hasRev && (wo.rev == 0 && cur.hasLive() || wo.rev != 0 && wo.rev != cur.rev) {
			outcome = &ConflictError{Entry: id, Expected: wo.rev, Current: cur.rev}
		}
		ch, err := decide(cur)
		typ, next := ch.typ, ch.next
		if outcome == nil {
			outcome = err
		}
		if (outcome != nil || typ == "") && !fresh {
			// The read alone decides: make sure it was not stale.
			fresh = true
			continue
		}
		if outcome != nil {
			return Result{}, outcome
		}
		if typ == "" {
			return Result{Revision: cur.rev, Entry: next}, nil
		}
		// An entry with schedule fields goes out in the form earlier
		// builds refuse (see GatedSuffix).
		typ = contract.GatedType(typ, next)
		// Put validated its entry before the loop; what the other changes
		// derive (a pause note, say) is checked here: nothing invalid is
		// ever published.
		// A removal needs only its id (see DecodeConfigEvent).
		if op != "put" && op != "remove" {
			if err := next.Validate(); err != nil {
				return Result{}, fmt.Errorf("%s: %w", op, err)
			}
		}
		data := ch.data
		if data == nil {
			if data, err = json.Marshal(next); err != nil {
				return Result{}, fmt.Errorf("%s: encode entry %q: %w", op, id, err)
			}
		}
		ev, err := contract.NewEventAt(contract.NewEventID(), c.now(), typ, c.source, id, json.RawMessage(data))
		if err != nil {
			return Result{}, err
		}
		seq, err := c.publish(ctx, subject, ev, cur.rev, false)
		if err == nil {
			stored := next.Clone()
			c.seen.put(id, state{rev: seq, base: seq, ev: ev, entry: &stored, canon: data})
			return Result{Revision: seq, Type: typ, Entry: next}, nil
		}
		c.seen.drop(id)
		var ce *ConflictError
		if !errors.As(err, &ce) {
			return Result{}, fmt.Errorf("%s entry %q: %w", op, id, err)
		}
		if wo.hasRev {
			ce.Expected = wo.rev
			return Result{}, ce
		}
		if round >= conflictRetries {
			return Result{}, fmt.Errorf("%s: gave up after %d concurrent changes: %w", op, round+1, ce)
		}
		// Someone else wrote in between (or the read was stale):
		// recompute against the leader's state.
		round++
		fresh = true
		if err := sleep(ctx, jitter(firstBackoff<<min(round, 5))); err != nil {
			return Result{}, fmt.Errorf("%s entry %q: %w", op, id, err)
		}
	}
}

// publish stores ev on subject if the last sequence of its entry's
// subjects (Names.EntryRevisionFilter: its config and fail-pause subjects)
// is still expected, and returns the event's stream sequence. Conditional
// on both subjects, a fail-pause request and an operator's change can
// never overwrite each other unseen.
//
// Transient answers are retried unchanged (same Nats-Msg-Id, same expected
// sequence) with backoff: timeouts, no responders, no leader or quorum, and
// "in process" answers of a replicated stream. A "wrong last sequence"
// answer is a conflict, unless an earlier attempt of this same event may
// have landed (mayHaveLanded: set by the caller for a retry, and after any
// attempt whose outcome is unknown). Then it is ambiguous and resolved by
// reading the first message on the subject after expected: if it is ours,
// the write succeeded.
//
// Why both checks are needed — how nats-server v2.15.2 answers a retried
// publish carrying a Nats-Msg-Id already stored plus
// Nats-Expected-Last-Subject-Sequence:
//
//   - R1 stream (stream.go, processJetStreamMsgWithBatch): the expected
//     last-subject-sequence check runs before the duplicate check, so the
//     retry is refused with 10071 "wrong last sequence: N", N being the
//     sequence our first attempt got. Only reading the subject tells it
//     from a real conflict.
//   - R3 stream (jetstream_batching.go, checkMsgHeadersPreClusteredProposal,
//     run by the leader before proposing): the duplicate check runs first,
//     so the retry gets a normal ack with "duplicate": true and the
//     original sequence. While the first attempt is proposed but not yet
//     applied the answer is 10158 "duplicate message id is in process"; a
//     publish on a subject that has another expected-sequence publish in
//     flight gets 10164 "wrong last sequence" without a sequence. Both are
//     transient: retried, they become a duplicate ack, a success or a real
//     10071. After a leader change the new leader rebuilds its dedupe map
//     from the stored messages, so a retry may also meet the R1-style 10071.
func (c *Client) publish(ctx context.Context, subject string, ev *contract.Event, expected uint64, mayHaveLanded bool) (uint64, error) {
	filter := c.names.EntryRevisionFilter(ev.Subject)
	data, err := ev.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode %s event: %w", ev.Type, err)
	}
	if max := c.js.Conn().MaxPayload(); max > 0 && int64(len(data))+256 > max {
		return 0, fmt.Errorf("%s event for %q is %d bytes, more than the server's max_payload %d: make the payload smaller or raise max_payload", ev.Type, ev.Subject, len(data), max)
	}
	var seq uint64
	err = c.retry(ctx, "publish to "+subject, func(actx context.Context) (bool, error) {
		ack, err := c.js.PublishMsg(actx, &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}},
			jetstream.WithMsgID(ev.ID), jetstream.WithExpectLastSequenceForSubject(expected, filter))
		if err == nil {
			// A duplicate ack (R3) carries the sequence our earlier
			// attempt got.
			seq = ack.Sequence
			return false, nil
		}
		if current, ok := wrongLastSequence(err); ok {
			if mayHaveLanded {
				if own, found, rerr := c.findOwn(actx, subject, filter, expected, ev.ID); rerr != nil {
					return isTransient(rerr), rerr
				} else if found {
					seq = own
					return false, nil
				}
			}
			if current == 0 {
				// The answer did not carry it: ask.
				cur, rerr := c.readRaw(actx, filter)
				if rerr != nil {
					return isTransient(rerr), rerr
				}
				if cur != nil {
					current = cur.Sequence
				}
			}
			return false, &ConflictError{Entry: ev.Subject, Expected: expected, Current: current}
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			s, serr := c.js.Stream(actx, c.names.ConfigStream())
			if errors.Is(serr, jetstream.ErrStreamNotFound) {
				return false, fmt.Errorf("config stream %s does not exist (create it with EnsureStreams): %w", c.names.ConfigStream(), serr)
			}
			if serr == nil && !capturesSubject(s.CachedInfo().Config.Subjects, subject) {
				return false, fmt.Errorf("config stream %s does not capture %s: %w", c.names.ConfigStream(), subject, ErrSubjectNotCaptured)
			}
		}
		if outcomeUnknown(err) {
			mayHaveLanded = true
		}
		return isTransient(err), err
	})
	return seq, err
}

// findOwn reads the first message under filter (the entry's subjects)
// after expected and reports whether it is the event with id eventID on
// subject. Only a publish that expected this sequence can be stored right
// after it, so if ours landed, it is that one.
func (c *Client) findOwn(ctx context.Context, subject, filter string, expected uint64, eventID string) (uint64, bool, error) {
	m, err := c.msgGet(ctx, msgGetRequest{Seq: expected + 1, NextFor: filter})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("resolve ambiguous publish: %w", err)
	}
	if m.Subject != subject {
		return 0, false, nil
	}
	if m.Header.Get(jetstream.MsgIDHeader) == eventID {
		return m.Sequence, true, nil
	}
	// A message published without our header: compare the event id.
	if ev, err := contract.DecodeEvent(m.Data); err == nil && ev.ID == eventID {
		return m.Sequence, true, nil
	}
	return 0, false, nil
}

// wrongLastSequence reports whether err is the definite 10071 "wrong last
// sequence: N" answer, and N when the answer carries it.
func wrongLastSequence(err error) (uint64, bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, false
	}
	_, num, ok := strings.Cut(apiErr.Description, ":")
	if !ok {
		return 0, true
	}
	n, perr := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
	if perr != nil {
		return 0, true
	}
	return n, true
}

// JetStream error codes that mean "not now" rather than "no".
const (
	errCodeClusterNotAvailable    = 10008 // no meta leader
	errCodeClusterNotLeader       = 10009
	errCodeInsufficientResources  = 10023 // the leader steps down
	errCodeStreamOffline          = 10118
	errCodeDuplicateInProcess     = 10158 // our own earlier attempt is being proposed
	errCodeWrongLastSeqInProcess  = 10164 // another expected-sequence publish on the subject is in flight
	errCodeClusterNoPeers         = 10005 // placement or quorum not possible right now
	errCodeStreamSequenceNotMatch = 10063 // clustered sequence mismatch while catching up
)

// isTransient reports whether a request may succeed if sent again
// unchanged.
func isTransient(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected):
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case errCodeClusterNotAvailable, errCodeClusterNotLeader, errCodeInsufficientResources,
			errCodeStreamOffline, errCodeDuplicateInProcess, errCodeWrongLastSeqInProcess,
			errCodeClusterNoPeers, errCodeStreamSequenceNotMatch:
			return true
		}
		return apiErr.Code == 503
	}
	return false
}

// outcomeUnknown reports whether a failed publish attempt may still have
// been stored: no answer came (timeout, lost connection), or the server
// says an earlier attempt with our id is being stored right now. Any other
// error answer means this attempt was not stored.
func outcomeUnknown(err error) bool {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionClosed):
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeDuplicateInProcess
}

// retry runs attempt until it succeeds, fails for good, the retry budget is
// spent or ctx ends. Each attempt gets its own timeout.
func (c *Client) retry(ctx context.Context, what string, attempt func(ctx context.Context) (transient bool, err error)) error {
	deadline := time.Now().Add(c.budget)
	backoff := firstBackoff
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		transient, err := attempt(actx)
		cancel()
		if err == nil {
			return nil
		}
		if !transient {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last answer: %v)", what, ctx.Err(), err)
		}
		if time.Now().Add(backoff).After(deadline) {
			return fmt.Errorf("%s: still failing after %d attempts in %s: %w", what, n, c.budget, err)
		}
		if serr := sleep(ctx, jitter(backoff)); serr != nil {
			return fmt.Errorf("%s: %w (last answer: %v)", what, serr, err)
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
