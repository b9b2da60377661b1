package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A fail-pause request is how a replica pauses an entry armed with
// pause_on_failure without a credential that may publish config: it
// publishes on <p>.failpause.<entry> (Names.FailPauseSubject), which the
// config stream captures beside the entry's config subject, an ordinary
// paused config event whose data is the entry's state with paused set and
// a note naming the task and its error, conditional on the entry's
// revision over both subjects (Names.EntryRevisionFilter), which the
// server checks and stores with the message.
//
// Readers apply a request only as that pause: the server guarantees that
// nothing was stored on the entry's subjects between the revision the
// request expects and the request, so the entry's state just before it is
// the one at that revision, and the request holds when that revision is
// the entry's config event (config events carry the full state) with the
// entry registered, armed (pause_on_failure) and not paused, and when the
// request's state is that state with paused set and a note of this
// package's form. Anything else is refused: not applied, reported, and the
// entry keeps its state (a refusal never quarantines, or a credential that
// may only ask for pauses could stop any entry).

// FailPauseNotePrefix starts the note of every fail-pause request: a pause
// note that names the task archived and its error (see failpause.Note).
const FailPauseNotePrefix = "paused on failure: "

// ErrFailPauseRefused is wrapped by every error that says why a fail-pause
// request is not applied.
var ErrFailPauseRefused = errors.New("fail-pause request refused")

// FailPauseRequest is a decoded fail-pause request, before it is checked
// against the entry's state.
type FailPauseRequest struct {
	Event *Event
	// Entry is the state the request asks for, normalized.
	Entry *Entry
	// Expected is the entry's revision the request is conditional on.
	Expected uint64
}

// ErrNotArmed is wrapped by FailPause's error when the entry is not armed:
// not registered, without pause_on_failure, or paused.
var ErrNotArmed = errors.New("entry is not armed with pause_on_failure")

// ErrSubjectNotCaptured is wrapped by the error of a write to a subject no
// stream captures: a config stream made before fail-pause requests, which
// `cronstream streams apply` brings up to date.
var ErrSubjectNotCaptured = errors.New("no stream captures the subject")

// capturesSubject reports whether one of a stream's subjects matches
// subject.
func capturesSubject(streamSubjects []string, subject string) bool {
	for _, s := range streamSubjects {
		if subjectMatches(s, subject) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether the literal subject matches filter, with
// NATS wildcards (* one token, > the rest).
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, t := range f {
		switch {
		case t == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case t != "*" && t != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

func refusedf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFailPauseRefused, fmt.Sprintf(format, args...))
}

// relayHeaders are set by a NATS server on a message it relays (a
// republish, a direct-get answer, a source or mirror), never by a client:
// a message that carries one was not published by a cronstream client.
var relayHeaders = []string{
	jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer,
	"Nats-Stream-Source", "Nats-Last-Sequence",
}

// DecodeFailPause decodes a message of the config stream stored on entry's
// fail-pause subject, with the headers the stream stored with it. It needs
// no state, so readers decode in parallel; Check then decides against the
// entry's state. The error wraps ErrFailPauseRefused.
func DecodeFailPause(names Names, entry string, header nats.Header, data []byte) (*FailPauseRequest, error) {
	one := func(key string) (string, error) {
		switch v := header.Values(key); len(v) {
		case 0:
			return "", refusedf("no %s header: not published by a cronstream client", key)
		case 1:
			return v[0], nil
		default:
			return "", refusedf("%d %s headers", len(v), key)
		}
	}
	for _, h := range relayHeaders {
		if header.Get(h) != "" {
			return nil, refusedf("header %s: relayed by a NATS server, not published by a cronstream client", h)
		}
	}
	filter, err := one(jetstream.ExpectedLastSubjSeqSubjHeader)
	if err != nil {
		return nil, err
	}
	if want := names.EntryRevisionFilter(entry); filter != want {
		return nil, refusedf("conditional on subject %q, not on the entry's %q", filter, want)
	}
	seqText, err := one(jetstream.ExpectedLastSubjSeqHeader)
	if err != nil {
		return nil, err
	}
	expected, perr := strconv.ParseUint(seqText, 10, 64)
	if perr != nil || expected == 0 {
		return nil, refusedf("expected revision %q is not a config event's sequence", seqText)
	}
	msgID, err := one(jetstream.MsgIDHeader)
	if err != nil {
		return nil, err
	}
	ev, e, err := DecodeConfigEvent(data)
	switch {
	case err != nil:
		return nil, refusedf("%v", err)
	case ev.ID != msgID:
		return nil, refusedf("event id %q is not its Nats-Msg-Id %q", ev.ID, msgID)
	case e.ID != entry:
		return nil, refusedf("data.id %q is not the entry of the subject", e.ID)
	case ConfigKind(ev.Type) != TypeEntryPaused:
		return nil, refusedf("type %q: a request may only pause", ev.Type)
	case !strings.HasPrefix(e.Note, FailPauseNotePrefix):
		return nil, refusedf("note %q does not start with %q", shorten(e.Note), FailPauseNotePrefix)
	}
	return &FailPauseRequest{Event: ev, Entry: e, Expected: expected}, nil
}

// Check decides whether r applies to base, the entry's state at revision
// baseRev, where baseRev is the sequence of the entry's config event that
// set base (nil base: the entry is not registered there, removed or
// quarantined). The error wraps ErrFailPauseRefused.
func (r *FailPauseRequest) Check(base *Entry, baseRev uint64) error {
	switch {
	case base == nil || base.Removed:
		return refusedf("entry %q is not registered, or its last change is not a config event", r.Entry.ID)
	case r.Expected != baseRev:
		return refusedf("conditional on revision %d, but the entry's last config event is at %d", r.Expected, baseRev)
	case !base.PauseOnFailure:
		return refusedf("entry %q is not armed with pause_on_failure at revision %d", r.Entry.ID, baseRev)
	case base.Paused:
		return refusedf("entry %q is already paused at revision %d", r.Entry.ID, baseRev)
	}
	want := base.Clone()
	want.Paused, want.Note = true, r.Entry.Note
	if t := GatedType(TypeEntryPaused, want); r.Event.Type != t {
		return refusedf("type %q, want %q", r.Event.Type, t)
	}
	a, err1 := json.Marshal(want)
	b, err2 := json.Marshal(r.Entry)
	if err1 != nil || err2 != nil || string(a) != string(b) {
		return refusedf("it changes more than paused and the note of entry %q", r.Entry.ID)
	}
	return nil
}

// ServerWrittenReason says why a message IsServerWritten found on subject
// is skipped.
func ServerWrittenReason(subject string) string {
	return "written on " + subject + " by a NATS server (an answer to a request that named it as its reply subject, or a relayed message), not published: skipped"
}

// IsServerWritten reports whether a message stored on a config or
// fail-pause subject was written there by a NATS server rather than
// published by a client. NATS delivers the answer to a request (a
// JetStream API call, a publish's acknowledgement, a pull request's
// status, a direct get) to whatever reply subject the requester named,
// and the config stream stores what arrives on its subjects; a republish
// copies a stored message onto other subjects. Such a message carries a
// header only a server sets when it relays a stored message (Nats-Stream
// and the like: a direct get's answer, a republish), or carries no
// Nats-Msg-Id (which every cronstream client sets) and is empty, a
// JetStream API response (its "type" is io.nats....) or a publish
// acknowledgement. Readers skip it: it changes no entry and quarantines
// none.
func IsServerWritten(header nats.Header, data []byte) bool {
	for _, h := range relayHeaders {
		if header.Get(h) != "" {
			return true
		}
	}
	if header.Get(jetstream.MsgIDHeader) != "" {
		return false
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return true
	}
	if data[0] != '{' {
		return false
	}
	var v struct {
		Type        string           `json:"type"`
		Stream      *string          `json:"stream"`
		SpecVersion *json.RawMessage `json:"specversion"`
	}
	if json.Unmarshal(data, &v) != nil || v.SpecVersion != nil {
		return false
	}
	return strings.HasPrefix(v.Type, "io.nats.") || v.Stream != nil
}

// FailPause asks for the pause of entry id on failure with a fail-pause
// request: rev is the entry's revision the caller saw armed (its config
// event's sequence), and note names the task and its error (it must start
// with FailPauseNotePrefix). The request is conditional on rev over both
// of the entry's subjects: a *ConflictError when the entry changed since,
// ErrNotArmed when it is not armed at rev, ErrNotFound when it does not
// exist. A stream that does not capture the fail-pause subject (made
// before this build, until `cronstream streams apply`) makes it fail with
// ErrSubjectNotCaptured.
func (c *Client) FailPause(ctx context.Context, id string, rev uint64, note string) (Result, error) {
	if err := ValidateID(id); err != nil {
		return Result{}, fmt.Errorf("fail-pause: %w", err)
	}
	if !strings.HasPrefix(note, FailPauseNotePrefix) {
		return Result{}, fmt.Errorf("fail-pause entry %q: the note must start with %q", id, FailPauseNotePrefix)
	}
	cur, err := c.read(ctx, id, true)
	if err != nil {
		return Result{}, fmt.Errorf("fail-pause entry %q: %w", id, err)
	}
	if cur.rev != rev || cur.base != rev || cur.failPause {
		return Result{}, &ConflictError{Entry: id, Expected: rev, Current: cur.rev}
	}
	e, err := cur.live(id)
	if err != nil {
		return Result{}, err
	}
	if !e.PauseOnFailure || e.Paused {
		return Result{}, fmt.Errorf("fail-pause entry %q at revision %d: %w", id, rev, ErrNotArmed)
	}
	e.Paused, e.Note = true, note
	if err := e.Validate(); err != nil {
		return Result{}, fmt.Errorf("fail-pause: %w", err)
	}
	typ := GatedType(TypeEntryPaused, e)
	data, err := json.Marshal(e)
	if err != nil {
		return Result{}, fmt.Errorf("fail-pause: encode entry %q: %w", id, err)
	}
	ev, err := NewEventAt(NewEventID(), c.now(), typ, c.source, id, json.RawMessage(data))
	if err != nil {
		return Result{}, err
	}
	seq, err := c.publish(ctx, c.names.FailPauseSubject(id), ev, rev, false)
	if err != nil {
		c.seen.drop(id)
		if errors.Is(err, ErrRevisionConflict) {
			return Result{}, err
		}
		return Result{}, fmt.Errorf("fail-pause entry %q: %w", id, err)
	}
	stored := e.Clone()
	c.seen.put(id, state{rev: seq, base: seq, failPause: true, ev: ev, entry: &stored, canon: data})
	return Result{Revision: seq, Type: typ, Entry: e}, nil
}

// CheckFailPause decides whether a message stored on a fail-pause subject
// is a request that applies, as every reader folding the entry's history
// decides: nil when it does, an error wrapping ErrFailPauseRefused saying
// why not, another error when the stream could not be read. It reads the
// one message the request expects (a request applies only right after a
// config event of an armed entry, and the server guarantees nothing came
// between), so a reader that shows messages one by one (audit) can tell.
func (c *Client) CheckFailPause(ctx context.Context, subject string, header nats.Header, data []byte) error {
	id, failPause, ok := c.names.EntryFromHistorySubject(subject)
	if !ok || !failPause {
		return refusedf("subject %q is not a fail-pause subject", subject)
	}
	req, err := DecodeFailPause(c.names, id, header, data)
	if err != nil {
		return err
	}
	var base *storedMsg
	err = c.retry(ctx, "read the revision a fail-pause request expects", func(actx context.Context) (bool, error) {
		var err error
		base, err = c.msgGet(actx, msgGetRequest{Seq: req.Expected})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			base, err = nil, nil
		}
		return isTransient(err), err
	})
	switch {
	case err != nil:
		return err
	case base == nil || base.Subject != c.names.ConfigSubject(id) || IsServerWritten(base.Header, base.Data):
		return refusedf("the message at revision %d is not a config event of entry %q", req.Expected, id)
	}
	s := c.decodeState(base.Subject, base.Sequence, base.Time, base.Data)
	if s.err != nil {
		return refusedf("entry %q is quarantined at revision %d", id, req.Expected)
	}
	return req.Check(s.entry, req.Expected)
}
