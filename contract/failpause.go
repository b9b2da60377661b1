package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

func refusedf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFailPauseRefused, fmt.Sprintf(format, args...))
}

// relayHeaders are set by a NATS server on a message it relays (a
// republish, a direct-get answer, a source or mirror), never by a client:
// a message that carries one was not published by a cronstream client.
var relayHeaders = []string{
	"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp",
	"Nats-Stream-Source", "Nats-Last-Sequence",
}

// The headers a client sets on a request (NATS's names, as nats.go's
// jetstream package spells them: TestHeaderNamesAreNATSs).
const (
	headerMsgID                   = "Nats-Msg-Id"
	headerExpectedLastSubjSeq     = "Nats-Expected-Last-Subject-Sequence"
	headerExpectedLastSubjSeqSubj = "Nats-Expected-Last-Subject-Sequence-Subject"
)

// headerGet is header's first value of key, "" when it has none; keys are
// matched exactly, as NATS headers are (nats.Header.Get).
func headerGet(header map[string][]string, key string) string {
	if v := header[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// DecodeFailPause decodes a message of the config stream stored on entry's
// fail-pause subject, with the headers the stream stored with it. It needs
// no state, so readers decode in parallel; Check then decides against the
// entry's state. The error wraps ErrFailPauseRefused.
func DecodeFailPause(names Names, entry string, header map[string][]string, data []byte) (*FailPauseRequest, error) {
	one := func(key string) (string, error) {
		switch v := header[key]; len(v) {
		case 0:
			return "", refusedf("no %s header: not published by a cronstream client", key)
		case 1:
			return v[0], nil
		default:
			return "", refusedf("%d %s headers", len(v), key)
		}
	}
	for _, h := range relayHeaders {
		if headerGet(header, h) != "" {
			return nil, refusedf("header %s: relayed by a NATS server, not published by a cronstream client", h)
		}
	}
	filter, err := one(headerExpectedLastSubjSeqSubj)
	if err != nil {
		return nil, err
	}
	if want := names.EntryRevisionFilter(entry); filter != want {
		return nil, refusedf("conditional on subject %q, not on the entry's %q", filter, want)
	}
	seqText, err := one(headerExpectedLastSubjSeq)
	if err != nil {
		return nil, err
	}
	expected, perr := strconv.ParseUint(seqText, 10, 64)
	if perr != nil || expected == 0 {
		return nil, refusedf("expected revision %q is not a config event's sequence", seqText)
	}
	msgID, err := one(headerMsgID)
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
func IsServerWritten(header map[string][]string, data []byte) bool {
	for _, h := range relayHeaders {
		if headerGet(header, h) != "" {
			return true
		}
	}
	if headerGet(header, headerMsgID) != "" {
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
